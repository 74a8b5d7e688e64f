"""kvmesh.cluster.config: the config trees (trees.py), their schema (schema.py), and the YAML / env / flag derivation."""
