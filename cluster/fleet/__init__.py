"""kvmesh.cluster.fleet: a started cluster's replica set changed at runtime: scale / drain / rollout (operations.py),
autoscaler."""
