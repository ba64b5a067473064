"""Installs the design's top-level folders as one import namespace, ``fedhop.*``.

docs/design.md ("Layout") keeps ``common/``, ``server/``, ``edge/``, ``client/``, ``transport/``, ``deploy/`` and
``proto/`` at the top of the repository. Installing them under generic top-level names would collide with other
packages, so ``fedhop/`` holds one relative symbolic link per folder (``fedhop/common -> ../common``, ...,
``fedhop/v1 -> ../proto/fedhop/v1``). The namespace is therefore an ordinary folder tree: an editor's
go-to-definition, an import-graph tool and ``python -c "import fedhop.common"`` run from the repository root all
resolve ``fedhop.common.spec`` to ``common/spec.py`` with no installation and no remapping. The wheel carries
real files (setuptools follows the links).
"""

from setuptools import find_packages, setup

packages = find_packages(include=["fedhop", "fedhop.*"])

# Everything a run needs beside the code: the default spec (``fedhop launch`` with no spec), the compose
# spec, the Dockerfile and base-image script (so ``fedhop compose`` works from an installed fedhop).
PACKAGE_DATA = {
    "fedhop": ["default_spec.toml"],
    "fedhop.v1": ["*.proto", "*.pyi"],
    "fedhop.deploy": ["Dockerfile", "*.toml", "*.sh"],
    "fedhop.server.web": ["static/*"],
}

setup(packages=packages, package_data=PACKAGE_DATA)
