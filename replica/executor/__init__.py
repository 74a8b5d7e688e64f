"""kvmesh.replica.executor: builds the engine's model runner (vLLM's ``vllm/v1/executor``): the engine calls it and
never names worker/."""
