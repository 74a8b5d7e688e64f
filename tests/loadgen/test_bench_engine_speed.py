"""``kvmesh bench engine-speed`` end to end on CPU: the tiny preset, a tiny workload, every measurement."""

from __future__ import annotations

import json

import pytest
import torch
from kvmesh.cluster.cli import main
from kvmesh.cluster.measure.benchmarks.engine_speed.model_files import ensure_model
from kvmesh.cluster.measure.benchmarks.engine_speed.presets import PRESETS
from kvmesh.replica.attention.backend import flash_attn_problem

pytestmark = pytest.mark.slow  # runs the engine benchmark

PREFIX = 64  # a multiple of both block sizes below, so the cached run can reuse all of it
BATCHES = (1, 4)
CONFIGS = "torch:16,torch:32,flash_attn:16,torch:16:graphs,torch:32768"  # the last: one block > the 16 MiB KV cache


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine_speed")
    out = tmp / "engine_cpu.json"
    argv = ["bench", "engine-speed", "--device", "cpu", "--preset", "tiny", "--model-cache-dir", str(tmp / "models"),
            "--num-requests", "6", "--decode-batches", ",".join(map(str, BATCHES)), "--decode-steps", "2",
            "--warmup-steps", "1", "--ttft-prefix-len", str(PREFIX), "--ttft-repeats", "1", "--hf-batch-size", "4",
            "--configs", CONFIGS, "--kv-cache-memory", "16MiB", "--out", str(out)]
    assert main(argv) == 0
    return {"results": json.loads(out.read_text()), "out": out, "models": tmp / "models"}


def _measured(results):
    return [c for c in results["configs"] if "skipped" not in c]


def test_runs_the_default_then_each_config_in_order(run):
    labels = [c["config"] for c in run["results"]["configs"]]
    assert labels == ["default", *CONFIGS.split(",")]
    assert [c["config"] for c in _measured(run["results"])] == ["default", "torch:16", "torch:32"]
    default = run["results"]["configs"][0]
    assert (default["backend"], default["block_size"], default["cuda_graphs"]) == ("torch", 16, False)
    assert run["results"]["configs"][2]["block_size"] == 32


def test_every_measured_config_has_workload_decode_and_ttft(run):
    results = run["results"]
    asked = results["workload"]["output_tokens"]
    for c in _measured(results):
        w = c["workload"]
        assert w["output_tokens"] == asked and w["num_requests"] == 6
        for key in ("wall_s", "cpu_s", "output_tok_per_s", "total_tok_per_s", "cpu_ms_per_output_token"):
            assert w[key] > 0, (c["config"], key)
        assert w["total_tok_per_s"] > w["output_tok_per_s"]  # prompt tokens count in the total
        assert [d["running_seqs"] for d in c["decode"]] == list(BATCHES)
        assert all(d["wall_ms_per_step"] > 0 and d["cpu_ms_per_step"] > 0 for d in c["decode"])
        assert c["ttft"]["cold"]["wall_ms"] > 0 and c["ttft"]["cached"]["wall_ms"] > 0


def test_cached_ttft_really_hit_the_prefix_cache_and_cold_did_not(run):
    for c in _measured(run["results"]):
        (rep,) = c["ttft"]["repeats"]
        assert rep["cached"]["num_cached_tokens"] >= PREFIX, c["config"]
        assert rep["cold"]["num_cached_tokens"] == 0, c["config"]


def test_configs_this_machine_cannot_run_are_skipped_with_the_reason(run):
    by_label = {c["config"]: c for c in run["results"]["configs"]}
    assert "CUDA graphs need a CUDA device" in by_label["torch:16:graphs"]["skipped"]
    assert "raise kv_cache_memory" in by_label["torch:32768"]["skipped"]  # the engine's own reason
    problem = flash_attn_problem(torch.device("cpu"), torch.float32)
    if problem is not None:
        assert by_label["flash_attn:16"]["skipped"] == problem


def test_hf_generate_and_the_weight_read_floor_are_measured_once(run):
    results = run["results"]
    hf = results["hf_generate"]
    assert hf["workload"]["batch_size"] == 4 and hf["workload"]["output_tok_per_s"] > 0
    assert [d["running_seqs"] for d in hf["decode"]] == list(BATCHES)
    assert all(d["wall_ms_per_step"] > 0 for d in hf["decode"])
    floor = results["weight_read_floor"]
    # the engine holds the bf16 checkpoint in float32 on CPU: twice the bytes of the file (plus its header)
    assert floor["weight_bytes"] == pytest.approx(2 * results["weight_file_bytes"], rel=0.05)
    assert floor["floor_ms_per_decode_step"] == pytest.approx(
        1000 * floor["weight_bytes"] / floor["bandwidth"]["bytes_per_s"])


def test_the_plot_is_written_beside_the_json(run):
    png = run["out"].with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_random_weights_are_made_once_and_reused(run):
    path = ensure_model(PRESETS["tiny"], str(run["models"]), seed=0)
    weights = next(path.glob("*.safetensors"))
    before = weights.stat().st_mtime_ns
    assert ensure_model(PRESETS["tiny"], str(run["models"]), seed=0) == path
    assert weights.stat().st_mtime_ns == before
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize(("configs", "says"), [
    ("nonesuch:16", "unknown attention backend 'nonesuch'; choose one of torch"),
    ("torch:big", "block size 'big' must be a positive integer"),
    ("torch", "is not backend:block_size[:graphs]"),
    ("torch:16:fast", "the third part may only be 'graphs'"),
])
def test_a_bad_configs_value_is_a_clear_error(configs, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "engine-speed", "--configs", configs])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_device_cuda_without_cuda_is_a_clear_error(capsys, tmp_path):
    assert main(["bench", "engine-speed", "--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--decode-batches", "1,many", "--decode-batches must be comma-separated positive integers"),
    ("--kv-cache-memory", "lots", "--kv-cache-memory='lots' is not a size"),
    ("--preset", "huge", "--preset must be one of tiny, tinyllama-1.1b"),
])
def test_a_bad_option_value_is_a_clear_error(flag, value, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "engine-speed", flag, value])
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_a_model_directory_without_a_config_is_a_clear_error(capsys, tmp_path):
    assert main(["bench", "engine-speed", "--device", "cpu", "--model", str(tmp_path), "--out",
                 str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "has no config.json; pass a Hugging Face model directory" in err and "Traceback" not in err


def test_the_summary_table_has_a_row_per_config_and_the_floor(run, capsys):
    from kvmesh.cluster.measure.benchmarks.engine_speed.report import summary_table

    table = summary_table(run["results"])
    for label in ("default (torch:16)", "| torch:32 |", "HF generate, static batches of 4"):
        assert label in table
    assert "| torch:16:graphs | skipped: CUDA graphs need a CUDA device" in table
    assert "Weight-read floor" in table


def test_configs_accept_any_registered_backend_name():
    """A backend added to the registry (such as "triton") is accepted without touching the bench."""
    from kvmesh.cluster.measure.benchmarks.engine_speed.variants import DEFAULT, EngineVariant, parse_variants

    assert parse_variants("default, triton:16:graphs,torch:256", ["torch", "triton"]) == [
        DEFAULT, EngineVariant("triton", 16, True), EngineVariant("torch", 256, False)]
    assert [v.label for v in parse_variants("triton:16:graphs", ["triton"])] == ["triton:16:graphs"]
    with pytest.raises(ValueError, match="unknown attention backend 'triton'; choose one of torch"):
        parse_variants("triton:16", ["torch"])


@pytest.mark.parametrize("device, kv_cache_memory", [("cpu", "16MiB"), ("cuda", None)])
def test_kv_cache_memory_sizes_the_cpu_cache_and_leaves_cuda_to_gpu_memory_utilization(tmp_path, device,
                                                                                      kv_cache_memory):
    from kvmesh.cluster.measure.benchmarks.engine_speed.options import EngineSpeedOptions
    from kvmesh.cluster.measure.benchmarks.engine_speed.run import make_plan

    options = EngineSpeedOptions(model_cache_dir=str(tmp_path), kv_cache_memory="16MiB")
    plan = make_plan(options, PRESETS["tiny"], torch.device(device))  # on cuda it would cap the cache
    assert plan.engine_config["kv_cache_memory"] == kv_cache_memory
    assert plan.engine_config["gpu_memory_utilization"] == options.gpu_memory_utilization
