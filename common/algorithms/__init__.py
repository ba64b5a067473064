"""Every algorithm module; importing this package registers them all (see engine/api.py)."""

from fedhop.common.algorithms import fedavg, local  # noqa: F401
