"""Component benchmarks: every module at the top is an area, ``kvmesh.cluster.measure.benchmarks.<area>`` with
``main(argv) -> int``, reachable as ``kvmesh bench <area>``; each writes JSON (and a plot where useful) to
``results/<area>.json`` by default. What the areas share (fake replicas, HTTP drivers, KV peers) is in ``support/``.
"""
