"""kvmesh.replica.worker: the worker: one rank's model, KV tensors and step inputs."""
