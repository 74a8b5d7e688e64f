"""kvmesh.router: the KV-cache-aware router (never imports torch).

    keys.py         router-side chained block keys (64-bit xxh3 chain over token ids + extra keys)
    index.py        PrefixIndex: per-replica cached blocks from KV events, prefix match per replica
    predictions.py  predicted entries: a routed request's blocks count as cached for a short TTL
    load.py         ReplicaLoad / LoadTracker: the router's in-flight counters + the replicas' /load
    policies/       registry: cache_aware (default), round_robin, least_loaded, random, prefix_hash
    kv_router.py    KVRouter: tokens -> keys -> match -> policy -> replica (pure, no I/O)
    receipts.py     RouteReceipt / Receipts: why a request went where it went, captured vs available reuse
    receipt_metrics.py  Prometheus counters and ratios of the receipts
    session.py      SessionTable: soft session affinity with a TTL
    runtime.py      RouterRuntime: replica set, event subscriber, health/load polling
    forward.py      proxying an OpenAI request (streaming passed through, retry before first byte)
    server.py       RouterServer: the proxied paths (hot routes) + the FastAPI app for the rest (admin plane
                    included); admin_routes.py: /replicas and /admin; metrics.py: Prometheus
    http/           the lean HTTP/1.1 server (proxied paths without ASGI) and the replica connection pool

The OpenAI front end itself (request models, tokenizer, auth, body limits, /tokenize) is ``kvmesh.replica.openai``, the one module of replica/ the router imports (torch-free).
"""
