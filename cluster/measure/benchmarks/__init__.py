"""Component benchmarks: ``kvmesh.cluster.measure.benchmarks.<area>`` modules with ``main(argv) -> int``.

Each writes JSON (and a plot where useful) to ``results/<area>.json`` by default and is
reachable as ``kvmesh bench <area>``. ``traces`` holds the shared trace readers.
"""
