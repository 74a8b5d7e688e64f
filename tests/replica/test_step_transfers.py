"""The engine step's host/device discipline: one device-to-host transfer per step, no hidden syncs, no mixing.

Checked on the CPU through a stand-in device (fake_device.py): the ``ModelRunner`` is built with its
device set to ``meta`` inside ``FakeDevice``, so every tensor it makes for its device reports ``meta``
but computes on the CPU. A tensor made without a device is then a host tensor, as on a GPU, and the
mode records, for each ``LLMEngine.step()`` (scheduling, ``execute_model``, output processing):

    d2h    device -> host copies          must be exactly 1 when the step samples (the sampled ids), else 0
    syncs  .item() / bool() / int() of device values, ops with value-dependent shapes    must be none
    mixed  host tensors meeting device tensors, .numpy() of a device tensor            must be none
    h2d    host -> device copies                                       must all be non-blocking

Requests asking for ``logprobs`` add one transfer per step (their packed logprobs); ``prompt_logprobs``
add one per prefill chunk (and one for the row pending from the previous chunk). The tokens are
compared with the same engine on the plain CPU, so the check cannot hide a wrong step.
"""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica import model_runner as model_runner_module
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine import LLMEngine
from kvmesh.replica.model_runner import ModelRunner
from kvmesh.replica.sampling_params import SamplingParams

from .fake_device import FAKE, DeviceTensor, FakeDevice, StepLog

PROMPT = [1, 403, 407, 261, 378, 445, 263, 265, 281, 398, 284, 425, 264, 383, 270, 449, 262, 312, 289]
LONG = PROMPT * 3  # 57 tokens: three full blocks of 16 that a second request finds in the prefix cache


def engine_config(path, **kw) -> EngineConfig:
    return EngineConfig(model=str(path), dtype="float32", device="cpu", attention_backend="torch", block_size=16,
                        kv_cache_memory=1 << 22, max_num_seqs=8, **kw)


def fake_engine(path, monkeypatch, **kw) -> LLMEngine:
    """An engine whose runner lives on the stand-in device (call inside ``FakeDevice``)."""
    config = engine_config(path, **kw)
    with monkeypatch.context() as patch:
        patch.setattr(model_runner_module, "_pick_device", lambda device, rank: FAKE)
        runner = ModelRunner(config)
    return LLMEngine(config, model_runner=runner)


def run(engine: LLMEngine, dev: FakeDevice | None, requests: dict[str, tuple[list[int], SamplingParams]],
        later: dict[str, tuple[list[int], SamplingParams]] | None = None):
    """Step until done; ``later`` requests join after the first step. Returns tokens, logs and sampled flags."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in [*requests, *(later or {})]}
    logs: list[tuple[StepLog, bool]] = []
    while engine.has_unfinished_requests():
        log = StepLog()
        if dev is None:
            outputs = engine.step()
        else:
            with dev.window() as log:
                outputs = engine.step()
        for out in outputs:
            tokens[out.request_id] += out.new_token_ids
        logs.append((log, any(out.new_token_ids for out in outputs)))
        for rid, (prompt, params) in (later or {}).items():
            engine.add_request(rid, prompt, params)
        later = None
    return tokens, logs


def assert_disciplined(logs: list[tuple[StepLog, bool]], extra_d2h: int = 0) -> None:
    assert logs, "no step ran"
    for i, (log, sampled) in enumerate(logs):
        assert log.syncs == [], f"step {i}"
        assert log.mixed == [], f"step {i}"
        assert len(log.d2h) == (1 + extra_d2h if sampled else 0), f"step {i}: {log.d2h}"
        assert all("non_blocking=True" in h2d for h2d in log.h2d), f"step {i}: {log.h2d}"


def cpu_tokens(path, requests, later=None, **kw) -> dict[str, list[int]]:
    config = engine_config(path, **kw)
    return run(LLMEngine(config, model_runner=ModelRunner(config)), None, requests, later)[0]


SAMPLING = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=6),
    "temperature": SamplingParams(temperature=0.9, seed=1, max_tokens=6),
    "top_k": SamplingParams(temperature=0.9, top_k=5, seed=2, max_tokens=6),
    "top_p": SamplingParams(temperature=0.9, top_p=0.8, seed=3, max_tokens=6),
    "top_k_top_p": SamplingParams(temperature=1.2, top_k=40, top_p=0.9, seed=4, max_tokens=6),
    "logit_bias": SamplingParams(temperature=0.0, logit_bias={300: 5.0, 301: -100.0}, max_tokens=6),
    "min_tokens": SamplingParams(temperature=0.7, min_tokens=4, seed=5, max_tokens=6),
}


@pytest.mark.parametrize("name", sorted(SAMPLING))
def test_each_sampling_option_costs_one_transfer_per_step_and_gives_the_cpu_tokens(stories_path, monkeypatch,
                                                                                   name):
    requests = {"a": (PROMPT, SAMPLING[name]), "b": (PROMPT[:7], SAMPLING[name])}
    with FakeDevice() as dev:
        tokens, logs = run(fake_engine(stories_path, monkeypatch), dev, requests)
    assert_disciplined(logs)
    assert tokens == cpu_tokens(stories_path, requests)
    assert all(len(t) == 6 for t in tokens.values())


def test_a_batch_mixing_every_sampling_option_costs_one_transfer_per_step(stories_path, monkeypatch):
    requests = {name: (PROMPT[: 5 + i], params) for i, (name, params) in enumerate(SAMPLING.items())}
    with FakeDevice() as dev:
        tokens, logs = run(fake_engine(stories_path, monkeypatch), dev, requests)
    assert_disciplined(logs)
    assert tokens == cpu_tokens(stories_path, requests)


def test_mixed_steps_chunked_prefills_and_prefix_hits_cost_one_transfer_per_sampling_step(stories_path,
                                                                                           monkeypatch):
    """Decodes next to a fresh prefill and a prefix-cache hit; a 24-token budget chunks the long prompt,
    so some steps sample nothing (and must transfer nothing)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    first = {"long": (LONG, greedy), "short": (PROMPT[:4], greedy)}
    later = {"hit": (LONG[:48] + [300, 301], greedy), "fresh": (PROMPT[3:], SamplingParams(temperature=0.8, seed=9,
                                                                                            max_tokens=5))}
    with FakeDevice() as dev:
        engine = fake_engine(stories_path, monkeypatch, max_num_batched_tokens=24)
        tokens, logs = run(engine, dev, first, later)
    assert engine.get_stats().prefix_cache_hits > 0
    assert any(not sampled for _, sampled in logs)  # a chunk-only step
    assert_disciplined(logs)
    assert tokens == cpu_tokens(stories_path, first, later, max_num_batched_tokens=24)


def test_logprobs_add_one_transfer_per_step(stories_path, monkeypatch):
    requests = {"lp": (PROMPT, SamplingParams(temperature=0.0, logprobs=3, max_tokens=4)),
                "plain": (PROMPT[:6], SamplingParams(temperature=0.0, max_tokens=4))}
    with FakeDevice() as dev:
        _, logs = run(fake_engine(stories_path, monkeypatch), dev, requests)
    assert_disciplined(logs, extra_d2h=1)


def test_prompt_logprobs_add_one_transfer_per_prefill_chunk(stories_path, monkeypatch):
    params = SamplingParams(temperature=0.0, prompt_logprobs=2, max_tokens=2)
    with FakeDevice() as dev:
        engine = fake_engine(stories_path, monkeypatch, max_num_batched_tokens=32)
        tokens, logs = run(engine, dev, {"p": (LONG, params)})
    # 57 prompt tokens in chunks of 32 + 25: chunk 1 one transfer; chunk 2 one for its rows, one for the row
    # pending from chunk 1, one for the sampled id; then a decode step with the sampled id only
    assert [len(log.d2h) for log, _ in logs] == [1, 3, 1]
    assert all(log.syncs == [] and log.mixed == [] for log, _ in logs)
    assert len(tokens["p"]) == 2


def test_the_check_sees_syncs_transfers_and_mixing():
    """The stand-in device records what a GPU would pay for (so the assertions above can fail)."""
    with FakeDevice() as dev, dev.window() as log:
        x = torch.arange(6, device=FAKE)
        assert isinstance(x, DeviceTensor) and x.device == FAKE
        assert int(x.max()) == 5 and bool(x.any())  # two syncs
        assert x.nonzero().shape == (5, 1)  # a value-dependent shape: a sync
        assert x.tolist() == list(range(6)) and x.cpu().tolist() == list(range(6))  # two transfers
        x + torch.ones(6, dtype=torch.int64)  # a host tensor meets a device tensor
        torch.zeros(3).to(FAKE)  # a blocking upload
    assert len(log.syncs) == 3 and len(log.d2h) == 2 and len(log.mixed) == 1
    assert log.h2d == [log.h2d[0]] and "non_blocking=False" in log.h2d[0]
    assert all("test_step_transfers" not in entry for entry in log.syncs)  # entries name kvmesh code only
