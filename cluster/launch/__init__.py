"""kvmesh.cluster.launch: starting a cluster on Ray."""
