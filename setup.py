"""Maps the design's top-level folders onto one import namespace, ``fedhop.*``.

DESIGN.md section 2 keeps ``common/``, ``server/``, ``edge/``, ``client/`` and ``proto/`` at the top of
the repository; installing them under generic top-level names would collide with other packages, so
they are installed as ``fedhop.common``, ``fedhop.server`` ... (editable installs map them too).
"""

from setuptools import find_packages, setup

ROOTS = {
    "fedhop": "fedhop",
    "fedhop.common": "common",
    "fedhop.server": "server",
    "fedhop.edge": "edge",
    "fedhop.client": "client",
    "fedhop.transport": "transport",
    "fedhop.deploy": "deploy",
    "fedhop.v1": "proto/fedhop/v1",
}

packages, package_dir = [], {}
for pkg, folder in ROOTS.items():
    package_dir[pkg] = folder
    packages += [pkg] + [f"{pkg}.{sub}" for sub in find_packages(folder)]

# Everything a run needs beside the code: the default spec (``fedhop launch`` with no spec), the compose
# spec, the Dockerfile and base-image script (so ``fedhop compose`` works from an installed fedhop).
PACKAGE_DATA = {
    "fedhop": ["default_spec.toml"],
    "fedhop.v1": ["*.proto", "*.pyi"],
    "fedhop.deploy": ["Dockerfile", "*.toml", "*.sh"],
    "fedhop.server.web": ["static/*"],
}

setup(packages=packages, package_dir=package_dir, package_data=PACKAGE_DATA)
