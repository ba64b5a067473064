"""fedhop: a federated-learning testbed (see the README).

Importing fedhop asks Intel's math library for conditional numerical reproducibility (``MKL_CBWR=AUTO,STRICT``,
unless the environment already sets ``MKL_CBWR``): without it, MKL may pick a kernel by the alignment of its
buffers on Intel CPUs, so two processes computing the same product can round differently, and the in-process
and networked engines would not be bit-identical on such machines (issue 19; docs/benchmarks.md). The variable
is read when MKL starts, so it is set here, before anything of fedhop imports torch, and role processes inherit it.
"""

import os
from importlib.metadata import PackageNotFoundError, version

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

try:
    __version__ = version("fedhop")
except PackageNotFoundError:  # a source tree that was never installed (pip install -e . gives the metadata)
    __version__ = "unknown (not installed)"
