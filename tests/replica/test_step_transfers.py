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
add one per prefill chunk (with the row pending from the previous chunk). The tokens are
compared with the same engine on the plain CPU, so the check cannot hide a wrong step. The runs
happen in a child process (fake_device_runs.py says why); the scenarios are defined there.
"""

from __future__ import annotations

import pytest

from .fake_device_runs import SAMPLING, run_in_child


@pytest.fixture(scope="module")
def child(two_layer_stories) -> dict:
    """Every run of the module, in one child process (each child pays the imports of torch and transformers);
    ``device_contexts`` last: torch's device contexts must still work after all the others. On stories260K cut
    to 2 layers: what a step transfers does not depend on the model's depth."""
    return run_in_child("engine_steps,static_steps,prefill_steps,the_check,device_contexts", two_layer_stories)


@pytest.fixture(scope="module")
def runs(child) -> dict:
    return child["engine_steps"]


def assert_disciplined(logs: list[dict], extra_d2h: int = 0) -> None:
    assert logs, "no step ran"
    for i, log in enumerate(logs):
        assert log["syncs"] == [], f"step {i}"
        assert log["mixed"] == [], f"step {i}"
        assert len(log["d2h"]) == (1 + extra_d2h if log["sampled"] else 0), f"step {i}: {log['d2h']}"
        assert all("non_blocking=True" in h2d for h2d in log["h2d"]), f"step {i}: {log['h2d']}"


@pytest.mark.parametrize("name", sorted(SAMPLING))
def test_each_sampling_option_costs_one_transfer_per_step_and_gives_the_cpu_tokens(runs, name):
    run = runs[f"option:{name}"]
    assert_disciplined(run["logs"])
    assert run["tokens"] == run["cpu_tokens"]
    assert all(len(t) == 6 for t in run["tokens"].values())


def test_a_greedy_step_uploads_its_inputs_in_one_copy(runs):
    """Input ids, positions, slots, query starts, sequence lengths, block tables and logits indices of a
    step go up together: one host-to-device copy of the step buffer (greedy rows need no sampling
    metadata; the torch backend these runs use, the CPU reference, uploads its decode groups itself)."""
    logs = runs["option:greedy"]["logs"]
    step_copies = [sum("(copy_to_gpu)" in h2d for h2d in log["h2d"]) for log in logs]
    assert step_copies == [1] * len(logs), [log["h2d"] for log in logs]


def test_a_step_mixing_every_sampling_option_uploads_its_settings_in_one_more_copy(runs):
    """Temperatures, greedy rows, top-k, top-p, seeded keys, bans and biases of the sampling rows go up
    together, after the step's inputs: two packed uploads a step."""
    logs = runs["all-options"]["logs"]
    packed = [sum("(copy_to_gpu)" in h2d for h2d in log["h2d"]) for log in logs]
    assert packed == [2] * len(logs), [log["h2d"] for log in logs]


def test_a_batch_mixing_every_sampling_option_costs_one_transfer_per_step(runs):
    run = runs["all-options"]
    assert_disciplined(run["logs"])
    assert run["tokens"] == run["cpu_tokens"]


def test_mixed_steps_chunked_prefills_and_prefix_hits_cost_one_transfer_per_sampling_step(runs):
    """Decodes next to a fresh prefill and a prefix-cache hit; a 24-token budget chunks the long prompt,
    so some steps sample nothing (and must transfer nothing)."""
    run = runs["mixed"]
    assert run["prefix_cache_hits"] > 0
    assert any(not log["sampled"] for log in run["logs"])  # a chunk-only step
    assert_disciplined(run["logs"])
    assert run["tokens"] == run["cpu_tokens"]


def test_logprobs_add_one_transfer_per_step(runs):
    assert_disciplined(runs["logprobs"]["logs"], extra_d2h=1)
    # both come back into the runner's host buffers (HostCopies: non-blocking), no ``.cpu()`` in the launch
    d2h = [d for log in runs["logprobs"]["logs"] for d in log["d2h"]]
    assert d2h and all(d.startswith("copy_ into a host tensor") for d in d2h), d2h


def test_prompt_logprobs_add_one_non_blocking_transfer_per_prefill_chunk(runs):
    logs = runs["prompt-logprobs"]["logs"]
    # 57 prompt tokens in chunks of 32 + 25: chunk 1 one transfer; chunk 2 one for its rows and the row pending
    # from chunk 1 together, one for the sampled id; then a decode step with the sampled id only
    assert [len(log["d2h"]) for log in logs] == [1, 2, 1]
    assert all(log["syncs"] == [] and log["mixed"] == [] for log in logs)
    # into the runner's pinned buffers, read when the step's output is: no ``.cpu()`` in the launch
    d2h = [d for log in logs for d in log["d2h"]]
    assert all(d.startswith("copy_ into a host tensor") for d in d2h), d2h
    assert len(runs["prompt-logprobs"]["tokens"]["p"]) == 2


def test_async_scheduling_keeps_one_transfer_per_step_and_the_tokens(runs):
    """Step N+1 is launched before step N's ids are read: each step() enqueues (at most) one transfer, every
    launched step's is read once, and decode inputs come from the device without a sync."""
    run = runs["async"]
    logs = run["logs"]
    assert all(log["syncs"] == [] and log["mixed"] == [] for log in logs)
    assert all(len(log["d2h"]) <= 1 for log in logs)
    assert sum(len(log["d2h"]) for log in logs) == sum(log["sampled"] for log in logs)
    assert all("non_blocking=True" in h2d for log in logs for h2d in log["h2d"])
    assert run["tokens"] == run["cpu_tokens"]


@pytest.fixture(scope="module")
def static_runs(child) -> dict:
    return child["static_steps"]


@pytest.mark.parametrize("scheduling", ["sync", "async", "sampled-sync", "sampled-async"])
def test_a_cuda_graph_decode_step_is_one_upload_one_run_one_copy_back(static_runs, scheduling):
    """On the static (CUDA-graph) path the step's inputs go up in one copy straight into the graph's inputs
    and the tokens come from the run itself: one host-to-device copy, one device-to-host copy. A sampled step
    (seeded temperature, top-k, top-p rows) too: its settings ride in the same copy, the graph draws."""
    run = static_runs[scheduling]
    assert run["on_device"] and run["static_rows"], run["static_rows"]
    assert all((sampling == "top_k_top_p") == scheduling.startswith("sampled") for _, sampling in run["static_rows"])
    assert run["tokens"] == run["cpu_tokens"]
    assert run["tokens"] == run["cpu_tokens"]
    # the flash-attn reference stands in for a CUDA kernel: what it does inside is no transfer of the step's
    kernel = "attention/flash_attn_reference.py"
    logs = [{k: [r for r in v if kernel not in r] if isinstance(v, list) else v for k, v in log.items()}
            for log in run["logs"]]
    if scheduling == "sync":
        assert_disciplined(logs)
    else:  # a step's copy back is read by the next step (see the async test above)
        assert all(log["syncs"] == [] and log["mixed"] == [] and len(log["d2h"]) <= 1 for log in logs)
        assert sum(len(log["d2h"]) for log in logs) == sum(log["sampled"] for log in logs)
    decode_only = [log for log in logs[1:] if log["d2h"]]  # steps that launched a decode (after the prefill)
    assert decode_only and all(len(log["h2d"]) == 1 and "(copy_to_gpu)" in log["h2d"][0] for log in decode_only), \
        [log["h2d"] for log in decode_only]


def test_a_cuda_graph_decode_step_with_logprobs_is_one_upload_one_run_one_copy_back(static_runs):
    """Logprobs rows (top-p seeded, greedy) on the graph path: the graph packs every row's logprobs with the token
    ids in column 0, so the ids come back in that one copy (the eager prefill step copies ids and logprobs)."""
    run = static_runs["logprobs-sync"]
    assert run["static_rows"] and all(sampling == "logprobs" for _, sampling in run["static_rows"])
    assert run["tokens"] == run["cpu_tokens"]
    kernel = "attention/flash_attn_reference.py"
    logs = [{k: [r for r in v if kernel not in r] if isinstance(v, list) else v for k, v in log.items()}
            for log in run["logs"]]
    assert all(log["syncs"] == [] and log["mixed"] == [] for log in logs)
    assert len(logs[0]["d2h"]) == 2  # the prefill: ids and logprobs, sampled eagerly
    decode = logs[1:]
    assert decode and all(len(log["d2h"]) == 1 and log["d2h"][0].startswith("copy_ into a host tensor")
                          for log in decode), [log["d2h"] for log in decode]
    assert all(len(log["h2d"]) == 1 and "(copy_to_gpu)" in log["h2d"][0]
               for log in decode), [log["h2d"] for log in decode]


@pytest.mark.parametrize("name", ["greedy", "sampled"])
def test_a_cached_prefix_prefill_step_is_one_upload_one_run_one_copy_back(prefill_runs, name):
    """5 tokens over a 256-token cached prefix, one request: the step's inputs (and its sampling settings) go up
    in one copy straight into the prefill graphs' inputs, the graph of 16 tokens runs, its token comes back in
    one copy (the LM head and the argmax or draw are inside the run)."""
    run = prefill_runs[name]
    assert run["on_device"] and run["prefix_cache_hits"] > 0
    assert run["staged"] == [[16, None if name == "greedy" else "top_k_top_p"]]
    assert run["tokens"] == run["cpu_tokens"]
    kernel = "attention/flash_attn_reference.py"  # stands in for a CUDA kernel: its inside is no transfer
    logs = [{k: [r for r in v if kernel not in r] if isinstance(v, list) else v for k, v in log.items()}
            for log in run["logs"]]
    assert_disciplined(logs)
    prefill = logs[0]
    assert len(prefill["h2d"]) == 1 and "(copy_to_gpu)" in prefill["h2d"][0], prefill["h2d"]
    assert len(prefill["d2h"]) == 1 and prefill["d2h"][0].startswith("copy_ into a host tensor"), prefill["d2h"]


@pytest.fixture(scope="module")
def prefill_runs(child) -> dict:
    return child["prefill_steps"]


def test_the_check_sees_syncs_transfers_and_mixing(child):
    """The stand-in device records what a GPU would pay for (so the assertions above can fail)."""
    log = child["the_check"]
    assert all(log["facts"])
    assert len(log["syncs"]) == 3 and len(log["d2h"]) == 2 and len(log["mixed"]) == 1
    assert len(log["h2d"]) == 1 and "non_blocking=False" in log["h2d"][0]


def test_the_stand_in_device_leaves_torch_device_contexts_working(child):
    assert child["device_contexts"] == {"device": "meta"}
