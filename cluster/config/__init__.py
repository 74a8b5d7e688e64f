"""kvmesh.cluster.config.trees: the config trees."""
