"""Every algorithm module; importing this package registers them all (see engine/api.py)."""

from fedhop.common.algorithms import (  # noqa: F401  (imported to register)
    centralized,
    dpsgd,
    dr_dsgd,
    drfa,
    fedadam,
    fedasync,
    fedau,
    fedavg,
    fedbuff,
    fedchs,
    fedcluster,
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
