"""``kvmesh sim``: replay a trace through the real router index and policies in front of N
simulated replicas, each owning a real ``kvcache`` block pool whose events feed the index.

Model time comes from a cost model (:mod:`.config`); everything else — block hashing,
LRU eviction, KV events, router keys, prefix matching, policy choice — is the production code.
Package import is light: nothing here imports torch.

    config.py     CostModel (step time) and SimConfig (one run)
    options.py    the commands' config trees (SimCommandConfig, ScalingCommandConfig): flags derive from them
    request.py    SimRequest (trace fields + timeline), made from trace records
    replica.py    SimReplica (KV cache manager + scheduler; role both, prefill or decode)
    router.py     SimRouter: one or several real KVRouters fed in-process, in simulated time
    transfer.py   KV that moves: prefill/decode splits and peer prefix pulls, priced and timed
    loop.py       the one discrete-event loop (run_policy), a fleet policy (fixed; autoscaled in scaling.py)
    run.py        compare_policies: several policies over one trace, with the ceilings
    report.py     per-policy summary, gap attribution, hit-rate ceilings, the table and JSON
    transfer_report.py  what the transfers did: splits, pulls, tokens moved, TTFT, inter-token latency
    stats.py      percentiles (plain and weighted) and max/mean balance
    priority.py   a replica's waiting queue under the engine's scheduling policy (fcfs, priority)
    goodput.py    requests meeting their TTFT and inter-token targets per second, per tenant and priority
    plots.py      the report's PNG (matplotlib, imported on use)
    scaling.py    replicas joining and leaving under the autoscaler (``python -m kvmesh.cluster.measure.sim.scaling``)
"""
