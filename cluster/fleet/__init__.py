"""kvmesh.cluster.fleet.operations: a running cluster's replica set."""
