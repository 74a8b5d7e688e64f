"""kvmesh.cluster.config: the config trees (trees.py), their schema (schema.py), the YAML / env / flag derivation, and
what the sections decide: replica roles (roles.py), GPU-share checks (gpu_share.py), the autoscale section."""
