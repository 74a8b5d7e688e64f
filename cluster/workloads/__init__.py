"""Workloads for the simulator and the load generator, in one place: public traces read from files,
traces generated in the same ``hash_ids`` form, and the prompt sessions an HTTP endpoint is sent.

    traces.py        Mooncake JSONL and Azure CSV readers (MooncakeRecord, AzureRecord, TraceError)
    block_tokens.py  token ids for a trace's hash ids (the same id always gives the same block)
    generated.py     generated hash_ids traces: multi-turn tenants, tool agents, Azure + prefixes, bursts
    sessions.py      prompt sessions sized by a token budget (chatbot, multi_turn, rag, random) and
                     trace replays (any hash_ids records, generated ones included; Azure lengths)
"""
