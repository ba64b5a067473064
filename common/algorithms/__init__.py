"""Every algorithm module; importing this package registers them all (see engine/api.py)."""

from fedhop.common.algorithms import fedavg, local  # noqa: F401
from fedhop.common.algorithms import dr_dsgd, drfa, fedadam, fgdro  # noqa: F401,E402  (FGDRO family)
from fedhop.common.algorithms import fedchs, qsgd, wrwgd  # noqa: F401,E402  (Fed-CHS family)
from fedhop.common.algorithms import fedcluster  # noqa: F401,E402  (FedCluster family)
from fedhop.common.algorithms import fedau, focus, mifa, participation, scaffold  # noqa: F401,E402  (FOCUS family)
