"""Sub-commands of the ``kvmesh`` CLI (see ``kvmesh.cluster.cli``)."""
