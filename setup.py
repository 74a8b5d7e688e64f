"""Maps the repository's top-level architecture folders onto the ``kvmesh.`` namespace.

``kvcache/`` installs as ``kvmesh.kvcache``, ``events/`` as ``kvmesh.events`` and so on
(ARCHITECTURE.md, "Layout and layering"); ``kvmesh`` itself is an implicit namespace package. Everything
else about the project lives in pyproject.toml.

The router's hot path (key chain + prefix match) is a C extension, ``kvmesh.router._fastpath``.
It is optional: without a C compiler or Python headers the build warns and the router uses its
pure-Python code, which gives identical results.
"""

import warnings

from setuptools import Extension, find_packages, setup
from setuptools.warnings import InformationOnly

# An editable install maps kvmesh.<top> onto the folders (setuptools' "lenient" mode) and says so in a
# ten-line notice on every `pip install -e .`; that is the layout above, on purpose.
warnings.filterwarnings("ignore", category=InformationOnly)

TOP_LEVEL = ("kvcache", "events", "replica", "router", "cluster")

packages, package_dir = [], {}
for top in TOP_LEVEL:
    package_dir[f"kvmesh.{top}"] = top
    packages.append(f"kvmesh.{top}")
    packages += [f"kvmesh.{top}.{sub}" for sub in find_packages(where=top)]

fastpath = Extension(
    "kvmesh.router._fastpath",
    sources=["router/_native/fastpath.c"],
    depends=["router/_native/xxhash.h"],
    include_dirs=["router/_native"],
    extra_compile_args=["-O3"],
    optional=True,
)

# Package data is named, not taken from MANIFEST.in: the extension's C sources (router/_native/, which has
# no __init__.py) go into the sdist to be compiled, not into the wheel as a package.
setup(packages=packages, package_dir=package_dir, package_data={"kvmesh.cluster": ["*.yaml"]},
      include_package_data=False, ext_modules=[fastpath])
