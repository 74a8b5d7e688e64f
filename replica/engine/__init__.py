"""kvmesh.replica.engine: the engine core: LLMEngine and its step, scheduler, AsyncLLM, requests, outputs, stats."""
