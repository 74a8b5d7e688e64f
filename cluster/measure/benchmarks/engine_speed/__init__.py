"""``kvmesh bench engine-speed``: the engine's speed on one device, per engine configuration.

Files, one concept each: ``presets`` (model shapes, workload sizes), ``variants`` (the
``backend:block_size[:graphs]`` configurations), ``options`` + ``cli`` (flags), ``model_files``
(random bf16 weights made once), ``timing``, ``workload``, ``decode``, ``ttft`` (the engine
measurements), ``hf_baseline``, ``bandwidth`` (weight-read floor), ``measure`` (one configuration),
``run`` (the whole run, JSON), ``report`` (the summary table), ``plot``.
"""


def main(argv: list[str] | None = None) -> int:
    from kvmesh.cluster.measure.benchmarks.engine_speed.cli import main as cli_main

    return cli_main(argv)
