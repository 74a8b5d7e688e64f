"""kvmesh.cluster.launch: starting a cluster on Ray, and the supervisor that keeps its replicas up."""
