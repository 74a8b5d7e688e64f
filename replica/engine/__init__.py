"""kvmesh.replica.engine.llm_engine: the engine core."""
