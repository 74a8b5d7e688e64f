"""Workloads for the simulator and the load generator, in one registry: every named workload makes
``hash_ids`` records; ``kvmesh sim`` simulates them, ``kvmesh bench load`` renders them into prompts.

    registry.py      the named workloads (``--workload`` of both commands) and their one-line docs
    settings.py      WorkloadSettings: the knobs both commands fill from their flags
    traces.py        Mooncake JSONL and Azure CSV readers (MooncakeRecord, AzureRecord, TraceError)
    generated.py     generated multi-request traces: multi-turn tenants, tool agents, Azure + prefixes, bursts
    single_turn.py   generated one-request sessions: chatbot questions, RAG lookups, random prompts
    sessions.py      the one renderer: records -> prompt sessions (a hash id -> a fixed block of tokens)
    block_tokens.py  token ids for a trace's hash ids (the same id always gives the same block)
"""
