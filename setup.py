"""Maps the repository's top-level architecture folders onto the ``kvmesh.`` namespace.

``kvcache/`` installs as ``kvmesh.kvcache``, ``events/`` as ``kvmesh.events`` and so on
(DESIGN.md, "Layout"); ``kvmesh`` itself is an implicit namespace package. Everything
else about the project lives in pyproject.toml.
"""

from setuptools import find_packages, setup

TOP_LEVEL = ("kvcache", "events", "replica", "router", "cluster")

packages, package_dir = [], {}
for top in TOP_LEVEL:
    package_dir[f"kvmesh.{top}"] = top
    packages.append(f"kvmesh.{top}")
    packages += [f"kvmesh.{top}.{sub}" for sub in find_packages(where=top)]

setup(packages=packages, package_dir=package_dir, package_data={"kvmesh.cluster": ["*.yaml"]})
