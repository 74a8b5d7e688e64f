"""`kvmesh bench load --workload lora`: requests spread over adapter names with Zipf popularity."""

from __future__ import annotations

from collections import Counter

from kvmesh.cluster.measure.loadgen.load import build_parser, run_async


async def test_the_lora_workload_names_its_adapters_as_the_model_most_popular_first(fake_server):
    args = build_parser().parse_args([
        "--url", fake_server.url, "--no-progress", "--no-plot", "--workload", "lora", "--num-requests", "60",
        "--num-adapters", "4", "--adapter-zipf", "1.5", "--base-share", "0.2", "--max-prompt-tokens", "48",
        "--max-tokens", "1", "--concurrency", "4"])
    run = await run_async(args)
    assert run["summary"]["errors"] == 0 and run["summary"]["ok"] == 60
    models = Counter(b["model"] for b in fake_server.state.requests)
    assert set(models) <= {"lora-0", "lora-1", "lora-2", "lora-3", "fake-model"}
    assert models["fake-model"] > 0  # base-model requests name the run's model
    assert models["lora-0"] > models["lora-3"] > 0
    per_model = run["summary"]["by_model"]
    assert {name: v["requests"] for name, v in per_model.items()} == dict(models)
    assert list(per_model)[0] == "lora-0" and per_model["lora-0"]["later_requests_cached"] > 0.5
