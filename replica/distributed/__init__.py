"""kvmesh.replica.distributed: tensor-parallel state and process-group setup (vLLM's ``vllm/distributed``)."""
