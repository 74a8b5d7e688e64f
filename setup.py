"""Maps the repository's top-level architecture folders onto the ``kvmesh.`` namespace.

``kvcache/`` installs as ``kvmesh.kvcache``, ``events/`` as ``kvmesh.events`` and so on
(ARCHITECTURE.md, "Layout and layering"); ``kvmesh`` itself is an implicit namespace package. Everything
else about the project lives in pyproject.toml.

The router's hot path (key chain + prefix match) is a C extension, ``kvmesh.router._fastpath``.
It is optional: without a C compiler or Python headers the build warns and the router uses its
pure-Python code, which gives identical results.
"""

from setuptools import Extension, find_packages, setup

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

setup(packages=packages, package_dir=package_dir, package_data={"kvmesh.cluster": ["*.yaml"]},
      ext_modules=[fastpath])
