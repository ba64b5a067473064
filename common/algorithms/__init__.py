"""Every algorithm module; importing this package registers them all (see engine/api.py)."""

from fedhop.common.algorithms import (  # noqa: F401  # noqa: F401,E402  (FGDRO family)  # noqa: F401,E402  (Fed-CHS family)  # noqa: F401,E402  (FOCUS family)
    centralized,
    dr_dsgd,
    drfa,
    fedadam,
    fedau,
    fedavg,
    fedchs,
    fedcluster,  # noqa: F401,E402  (FedCluster family)
    fgdro,
    focus,
    local,
    mifa,
    participation,
    proxskip,
    qsgd,
    scaffold,
    wrwgd,
)
