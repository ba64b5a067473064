"""fedhop: a federated-learning testbed (see the README)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedhop")
except PackageNotFoundError:  # a source tree that was never installed (pip install -e . gives the metadata)
    __version__ = "unknown (not installed)"
