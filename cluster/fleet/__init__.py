"""kvmesh.cluster.fleet: a running cluster's replica set: supervisor, scale / drain / rollout (operations.py), autoscaler."""
