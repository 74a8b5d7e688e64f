"""The runs behind test_step_transfers.py and test_cpu_gpu_buffer.py, done in a child process.

``FakeDevice`` swaps torch globals while it is installed (``torch.Generator``, ``torch.tensor``), and
torch caches some of them on first use: once, ``torch.device(...)`` contexts cached the stand-in
``torch.tensor``, so every later ``torch.device("meta")`` context in the process -- transformers builds
its models in one -- left ``torch.tensor(...)`` results on the CPU, and transformers' ``generate``
gave wrong tokens in later tests. FakeDevice now fills that cache first (``device_contexts`` checks
it); the runs still happen in a fresh interpreter (``run_in_child``) so that no other such leak can
reach the rest of the suite. The tests assert on the JSON these functions print.

    python tests/replica/fake_device_runs.py FUNCTION[,FUNCTION...] STORIES_PATH   -> JSON on the last stdout line
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvmesh.replica.engine.engine_request import EngineRequest

HERE = Path(__file__).resolve().parent
PROMPT = [1, 403, 407, 261, 378, 445, 263, 265, 281, 398, 284, 425, 264, 383, 270, 449, 262, 312, 289]
LONG = PROMPT * 3  # 57 tokens: three full blocks of 16 that a second request finds in the prefix cache
SAMPLING = {
    "greedy": dict(temperature=0.0, max_tokens=6),
    "temperature": dict(temperature=0.9, seed=1, max_tokens=6),
    "top_k": dict(temperature=0.9, top_k=5, seed=2, max_tokens=6),
    "top_p": dict(temperature=0.9, top_p=0.8, seed=3, max_tokens=6),
    "top_k_top_p": dict(temperature=1.2, top_k=40, top_p=0.9, seed=4, max_tokens=6),
    "logit_bias": dict(temperature=0.0, logit_bias={300: 5.0, 301: -100.0}, max_tokens=6),
    "min_tokens": dict(temperature=0.7, min_tokens=4, seed=5, max_tokens=6),
    "allowed_token_ids": dict(temperature=0.9, allowed_token_ids=[300, 301, 302], seed=6, max_tokens=6),
}


def scenarios() -> dict[str, tuple[dict, dict, dict | None]]:
    """name -> (engine config overrides, requests {id: (prompt, params)}, requests joining after step 1)."""
    out = {f"option:{name}": ({}, {"a": (PROMPT, p), "b": (PROMPT[:7], p)}, None) for name, p in SAMPLING.items()}
    out["all-options"] = ({}, {name: (PROMPT[: 5 + i], p) for i, (name, p) in enumerate(SAMPLING.items())}, None)
    greedy = dict(temperature=0.0, max_tokens=5)
    out["mixed"] = ({"max_num_batched_tokens": 24}, {"long": (LONG, greedy), "short": (PROMPT[:4], greedy)},
                    {"hit": (LONG[:48] + [300, 301], greedy),
                     "fresh": (PROMPT[3:], dict(temperature=0.8, seed=9, max_tokens=5))})
    out["logprobs"] = ({}, {"lp": (PROMPT, dict(temperature=0.0, logprobs=3, max_tokens=4)),
                            "plain": (PROMPT[:6], dict(temperature=0.0, max_tokens=4))}, None)
    out["prompt-logprobs"] = ({"max_num_batched_tokens": 32},
                              {"p": (LONG, dict(temperature=0.0, prompt_logprobs=2, max_tokens=2))}, None)
    out["async"] = ({"async_scheduling": True, "max_num_batched_tokens": 24},
                    {"a": (LONG, greedy), "b": (PROMPT, SAMPLING["top_k_top_p"]),
                     "c": (PROMPT[:5], SAMPLING["min_tokens"])},
                    {"d": (LONG[:40], SAMPLING["logit_bias"])})
    return out


def _engine(path: str, on_fake: bool, **kw):
    from fake_device import FAKE
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.worker import model_runner

    kw = dict(dict(attention_backend="torch", block_size=16, kv_cache_memory=1 << 22), **kw)
    config = EngineConfig(model=path, dtype="float32", device="cpu", max_num_seqs=8, **kw)
    pick = model_runner.pick_device
    if on_fake:
        model_runner.pick_device = lambda device, rank: FAKE
    try:
        runner = model_runner.ModelRunner(config)
    finally:
        model_runner.pick_device = pick
    return LLMEngine(config, model_runner=runner)


def _run(engine, dev, requests, later) -> tuple[dict, list]:
    """Step until done; ``later`` requests join after the first step. Returns tokens and per-step logs."""
    from fake_device import StepLog
    from kvmesh.replica.serving.sampling_params import SamplingParams

    def add(reqs):
        for rid, (prompt, params) in reqs.items():
            engine.add_request(EngineRequest(rid, prompt, SamplingParams(**params)))

    add(requests)
    tokens = {rid: [] for rid in [*requests, *(later or {})]}
    logs = []
    while engine.has_unfinished_requests():
        log = StepLog()
        if dev is None:
            outputs = engine.step()
        else:
            with dev.window() as log:
                outputs = engine.step()
        for out in outputs:
            tokens[out.request_id] += out.new_token_ids
        logs.append({"d2h": log.d2h, "syncs": log.syncs, "mixed": log.mixed, "h2d": log.h2d,
                     "sampled": any(out.new_token_ids for out in outputs)})
        if later:
            add(later)
            later = None
    return tokens, logs


def engine_steps(path: str) -> dict:
    """Every scenario on the stand-in device (tokens, per-step logs) and on the plain CPU (tokens)."""
    from fake_device import FakeDevice

    results = {}
    for name, (kw, requests, later) in scenarios().items():
        with FakeDevice() as dev:
            engine = _engine(path, True, **kw)
            tokens, logs = _run(engine, dev, requests, later)
            hits = engine.get_stats().prefix_cache_hits
        sync = {k: v for k, v in kw.items() if k != "async_scheduling"}  # the reference schedules synchronously
        cpu, _ = _run(_engine(path, False, **sync), None, requests, later)
        results[name] = {"tokens": tokens, "cpu_tokens": cpu, "logs": logs, "prefix_cache_hits": hits}
    return results


def static_steps(path: str) -> dict:
    """Decode steps on the CUDA-graph path (its padded forward run eagerly through the flash-attn reference at
    block 256), greedy and sampled (seeded temperature, top-k, top-p: the graph's own draw), synchronous and
    async-scheduled, on the stand-in device and on the plain CPU."""
    import torch
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)
    from fake_device import FakeDevice
    from kvmesh.replica.attention import flash_attn_reference
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode

    sys.modules["flash_attn"] = reference = flash_attn_reference.as_module(allow_float32=True)
    reference.SUPPORTED_DEVICES = ("cpu", "meta")  # plain torch: it runs on the stand-in device too
    greedy = dict(temperature=0.0, max_tokens=6)
    greedy_requests = {"a": (PROMPT, greedy), "b": (PROMPT[:7], greedy), "c": (PROMPT[:3], dict(greedy, max_tokens=3))}
    sampled = {"a": (PROMPT, SAMPLING["top_k_top_p"]), "b": (PROMPT[:7], SAMPLING["temperature"]),
               "c": (PROMPT[:3], dict(SAMPLING["top_p"], max_tokens=3)), "d": (PROMPT[:5], SAMPLING["top_k"])}
    logprobs = {"a": (PROMPT, dict(SAMPLING["top_p"], logprobs=2)), "b": (PROMPT[:7], dict(greedy, logprobs=0))}
    results = {}
    for name, kw, requests in (("sync", {}, greedy_requests), ("async", {"async_scheduling": True}, greedy_requests),
                               ("sampled-sync", {}, sampled), ("sampled-async", {"async_scheduling": True}, sampled),
                               ("logprobs-sync", {}, logprobs)):
        kw = dict(kw, attention_backend="flash_attn", block_size=256, kv_cache_memory=1 << 24)
        with FakeDevice() as dev:
            engine = _engine(path, True, **kw)
            runner, static_rows = engine.model_runner, []
            runner.static_decode = static = StaticDecode(runner.model, runner.attn_backend, 8,
                                                         runner.input_batch.block_tables.table.shape[1], 256,
                                                         runner.device)
            run = static.run
            static.run = lambda n, sampling=None, rows=static_rows, run=run: rows.append([n, sampling]) or run(n,
                                                                                                               sampling)
            tokens, logs = _run(engine, dev, requests, None)
        sync = {k: v for k, v in kw.items() if k != "async_scheduling"}
        cpu, _ = _run(_engine(path, False, **sync), None, requests, None)
        results[name] = {"tokens": tokens, "cpu_tokens": cpu, "logs": logs, "static_rows": static_rows,
                         "on_device": str(static.inputs.input_ids.device) == str(torch.device("meta"))}
    return results


def prefill_steps(path: str) -> dict:
    """A cached-prefix step on the prefill graphs' path (prefill_graph.py: its padded forward run eagerly through
    the flash-attn reference at block 256): a 300-token prompt fills the cache, then 5 tokens over its block,
    greedy and sampled (seeded top-p: the graph's draw), on the stand-in device and on the plain CPU."""
    import torch
    import transformers.integrations.flash_attention  # noqa: F401  (probes flash_attn before the stand-in)
    from fake_device import FakeDevice
    from kvmesh.replica.attention import flash_attn_reference
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode

    sys.modules["flash_attn"] = reference = flash_attn_reference.as_module(allow_float32=True)
    reference.SUPPORTED_DEVICES = ("cpu", "meta")
    prefix = (PROMPT * 14)[:256]
    results = {}
    for name, params in (("greedy", dict(temperature=0.0, max_tokens=3)), ("sampled", SAMPLING["top_p"])):
        fill, hit = {"fill": (prefix + PROMPT[:12] * 4, params)}, {"hit": (prefix + PROMPT[:5], params)}
        kw = dict(attention_backend="flash_attn", block_size=256, kv_cache_memory=1 << 24)
        with FakeDevice() as dev:
            engine = _engine(path, True, **kw)
            runner, staged = engine.model_runner, []
            runner.static_decode = static = StaticDecode(runner.model, runner.attn_backend, 8,
                                                         runner.input_batch.block_tables.table.shape[1], 256,
                                                         runner.device, runner.max_model_len)
            run = static.prefill.run
            static.prefill.run = lambda size, sampling=None, staged=staged, run=run: staged.append([size, sampling]) \
                or run(size, sampling)
            _run(engine, dev, fill, None)
            tokens, logs = _run(engine, dev, hit, None)
            hits = engine.get_stats().prefix_cache_hits
        cpu = _engine(path, False, **kw)
        _run(cpu, None, fill, None)
        cpu_tokens, _ = _run(cpu, None, hit, None)
        results[name] = {"tokens": tokens, "cpu_tokens": cpu_tokens, "logs": logs, "staged": staged,
                         "prefix_cache_hits": hits,
                         "on_device": str(static.prefill.inputs.input_ids.device) == str(torch.device("meta"))}
    return results


def the_check(path: str) -> dict:
    """What the stand-in device records for known syncs, transfers and mixing."""
    import torch
    from fake_device import FAKE, DeviceTensor, FakeDevice

    with FakeDevice() as dev, dev.window() as log:
        x = torch.arange(6, device=FAKE)
        facts = [isinstance(x, DeviceTensor), x.device == FAKE, int(x.max()) == 5, bool(x.any()),
                 tuple(x.nonzero().shape) == (5, 1), x.tolist() == list(range(6)),
                 x.cpu().tolist() == list(range(6))]
        x + torch.ones(6, dtype=torch.int64)  # a host tensor meets a device tensor
        torch.zeros(3).to(FAKE)  # a blocking upload
    return {"facts": facts, "d2h": log.d2h, "syncs": log.syncs, "mixed": log.mixed, "h2d": log.h2d}


def step_buffers(path: str) -> dict:
    """Two steps' inputs against the persistent buffers, and a step larger than the buffers."""
    import numpy as np
    import torch
    from fake_device import FAKE, FakeDevice
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
    from kvmesh.replica.utils.cpu_gpu_buffer import to_device
    from kvmesh.replica.worker.input_batch import InputBatch

    def storage(t):
        return t.elem.untyped_storage().data_ptr()

    sp = SamplingParams(temperature=0.0)
    with FakeDevice() as dev:
        batch = InputBatch(4, 4, 4, FAKE, max_num_tokens=4)
        bufs = batch.buffers
        with dev.window() as log:
            first = batch.prepare(SchedulerOutput([ScheduledRequest("a", [10, 11, 12], 0, [7], True, sp)], 3))
        batch.record_samples(first.sample_rows, np.array([42]))
        second = batch.prepare(SchedulerOutput([], 1, decode_request_ids=["a"]))
        same = [storage(i.input_ids) == storage(bufs.arena.gpu) and
                storage(i.common.block_tables) == storage(bufs.arena.gpu) for i in (first, second)]
        second_inputs = [second.input_ids.tolist(), second.positions.tolist()]  # valid until the next step
        big = batch.prepare(SchedulerOutput([ScheduledRequest("b", list(range(1, 11)), 0, [8, 9, 5], True, sp)], 10))
        with dev.window() as upload:
            small = to_device([3, 1, 2], torch.int64, FAKE)
        return {"same_buffers": same, "h2d": log.h2d, "second": second_inputs,
                "big": [big.input_ids.tolist(), big.positions.tolist(), big.common.slot_mapping.tolist()],
                "small": [small.device == FAKE, small.tolist()], "small_h2d": upload.h2d}


def token_copies(path: str) -> dict:
    """Where each step's sampled ids land on the host (their data pointers) against the runner's buffers."""
    from fake_device import FakeDevice

    greedy = dict(temperature=0.0, max_tokens=6)
    requests = {"a": (PROMPT, greedy), "b": (PROMPT[:7], SAMPLING["top_p"])}
    with FakeDevice() as dev:
        engine = _engine(path, True)
        copies = engine.model_runner.token_copies
        storages, start = [], copies.start

        def recorded(t):
            host, event = start(t)
            storages.append(host.data_ptr())
            return host, event

        copies.start = recorded
        tokens, _ = _run(engine, dev, requests, None)
    ring = [copies.host[i].data_ptr() for i in range(copies.host.shape[0])] * len(storages)
    cpu, _ = _run(_engine(path, False), None, requests, None)
    return {"storages": storages, "ring": ring, "tokens": tokens, "cpu_tokens": cpu}


def device_contexts(path: str) -> dict:
    """The device a ``torch.device("meta")`` context gives ``torch.tensor`` after FakeDevice was used."""
    import torch
    from fake_device import FAKE, FakeDevice

    with FakeDevice(), torch.device(FAKE):
        torch.zeros(1)
    with torch.device("meta"):
        return {"device": str(torch.tensor([1.0]).device)}


def run_in_child(function: str, stories_path) -> dict:
    """``function``'s result, computed in a fresh interpreter (see the module docstring); ``function`` may name
    several, comma-separated, run one after another in the same child: then a dict of their results by name."""
    names = function.split(",")
    proc = subprocess.run([sys.executable, str(Path(__file__)), function, str(stories_path)], capture_output=True,
                          text=True, timeout=240 * len(names))
    if proc.returncode != 0:
        raise RuntimeError(f"{function} failed in the child process:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    results = {name: globals()[name](sys.argv[2]) for name in sys.argv[1].split(",")}
    print(json.dumps(results if len(results) > 1 else next(iter(results.values()))))
