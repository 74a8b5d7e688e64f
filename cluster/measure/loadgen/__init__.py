"""``kvmesh bench load``: an HTTP load generator for any OpenAI-compatible endpoint.

A registered workload (``kvmesh.cluster.measure.workloads``) is rendered into sessions of turns; the runner
(:mod:`.runner`) sends them open-loop (Poisson or trace timestamps) or closed-loop (fixed concurrency) with the
streaming
client (:mod:`.client`); :mod:`.report` and :mod:`.plots` turn the results into JSON and PNGs.
Nothing here imports torch.
"""
