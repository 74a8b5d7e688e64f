"""LoRA adapters on a real stories260K engine against transformers + peft (offline).

Three PEFT adapters made here (random A and B, r=8, every projection): each request of a batch mixing the base
model and the adapters gives transformers + peft's greedy tokens and logprobs for its adapter (the base model's
for the base) -- with fewer device slots than adapters, under preemption and with the host KV tier."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.serving.lora_request import LoRARequest  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .lora_fixtures import MAX_TOKENS, PROMPTS, greedy, make_adapter  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def adapters(stories_path, tmp_path_factory):
    """(LoRARequest, {prompt index: Reference}) of three adapters, and the base model's references under None."""
    root = tmp_path_factory.mktemp("loras")
    out = {}
    for i in (1, 2, 3):
        model = make_adapter(stories_path, root / f"a{i}", seed=i)
        out[LoRARequest(f"a{i}", i, str(root / f"a{i}"))] = [greedy(model, p) for p in PROMPTS]
        if i == 1:
            with model.disable_adapter():
                out[None] = [greedy(model, p) for p in PROMPTS]
    return out


def make_engine(stories_path, **kw) -> LLMEngine:
    kw.setdefault("kv_cache_memory", "4MiB")
    return LLMEngine(EngineConfig(model=str(stories_path), dtype="float32", device="cpu", enable_lora=True,
                                  max_lora_rank=8, debug_check_integrity=True, **kw))


def run_all(engine: LLMEngine, adapters, rounds: int = 1) -> dict:
    """Every (adapter or base, prompt) as one request, all queued together; their final outputs."""
    finals, n = {}, 0
    for r in range(rounds):
        for lora in adapters:
            for p, prompt in enumerate(PROMPTS):
                engine.add_request(EngineRequest(f"{lora and lora.lora_name}-{p}-{r}", prompt, GREEDY,
                                                 lora_request=lora))
                n += 1
    for _ in range(2000):
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if len(finals) == n:
            return finals
    raise AssertionError(f"{n - len(finals)} requests never finished")


def check(finals, adapters, rounds: int = 1) -> None:
    for lora, refs in adapters.items():
        for p, ref in enumerate(refs):
            for r in range(rounds):
                out = finals[f"{lora and lora.lora_name}-{p}-{r}"]
                assert out.finish_reason == "length", out.error
                assert out.output_token_ids == ref.tokens, (lora, p)
                got = [lp.logprobs[0] for lp in out.logprobs]
                assert got == pytest.approx(ref.logprobs, abs=1e-4), (lora, p)


def test_a_batch_of_the_base_and_three_adapters_equals_transformers_and_peft(stories_path, adapters):
    engine = make_engine(stories_path, max_loras=3)
    check(run_all(engine, adapters), adapters)
    load = engine.loras.load(["a1", None])
    assert load.enabled and load.max_loras == 3 and sorted(load.resident) == ["a1", "a2", "a3"]
    assert set(load.adapters) == {"a1", "a2", "a3"} and all(b > 0 for b in load.adapters.values())
    assert load.active == ["a1"] and load.load_bytes_per_s > 0


def test_fewer_slots_than_adapters_under_preemption(stories_path, adapters):
    """Two slots for three adapters (the scheduler holds a step to max_loras, slots are swapped) and a pool so
    small that requests are preempted: every request still gives its reference."""
    engine = make_engine(stories_path, max_loras=2, max_cpu_loras=2, num_kv_blocks=12, block_size=4,
                         max_num_batched_tokens=32)
    steps = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        steps.append({engine.scheduler.requests[rid].lora_name for rid in out.request_ids()} - {None})
        return out

    engine.scheduler.schedule = recording
    check(run_all(engine, adapters, rounds=2), adapters, rounds=2)
    assert engine.scheduler.num_preemptions > 0
    assert max(map(len, steps)) == 2  # never three adapters in one step


def test_with_the_host_tier_and_no_block_shared_across_adapters(stories_path, adapters):
    """A device pool too small for the batch over a host tier: the second round's prompts come back cached (from
    the device or the host), each under its own adapter, with the same tokens."""
    engine = make_engine(stories_path, max_loras=4, block_size=4, num_kv_blocks=16, kv_offload_memory="8MiB")
    check(run_all(engine, adapters), adapters)
    again = run_all(engine, adapters)
    check(again, adapters)
    assert all(out.num_cached_tokens > 0 for out in again.values())
    assert any(out.num_host_cached_tokens for out in again.values())
    fresh = make_engine(stories_path, max_loras=4, block_size=4)
    base = {None: adapters[None]}
    run_all(fresh, base)
    for lora in adapters:  # the same prompts under each adapter: none of the base's blocks (nor each other's)
        if lora is not None:
            assert all(out.num_cached_tokens == 0 for out in run_all(fresh, {lora: adapters[lora]}).values())
    assert all(out.num_cached_tokens > 0 for out in run_all(fresh, base).values())  # the base finds its own


def test_adapters_registered_at_start_and_removed(stories_path, adapters):
    named = {lora.lora_name: lora.lora_path for lora in adapters if lora is not None}
    engine = make_engine(stories_path, lora_modules=named)
    assert sorted(lora.lora_name for lora in engine.list_loras()) == sorted(named)
    a1 = next(lora for lora in engine.list_loras() if lora.lora_name == "a1")
    assert not engine.add_lora(a1)  # registered already
    with pytest.raises(ValueError, match="remove it first"):
        engine.add_lora(LoRARequest("a1", a1.lora_int_id, named["a2"]))
    with pytest.raises(ValueError, match="is registered as"):
        engine.add_request(EngineRequest("x", PROMPTS[0], GREEDY,
                                         lora_request=LoRARequest("a1", a1.lora_int_id, "/elsewhere")))
    assert engine.remove_lora("a1") and not engine.remove_lora("a1")
    assert "a1" not in engine.loras.load([]).adapters


def test_the_triton_kernels_in_an_engine_step_equal_transformers_and_peft(stories_path, adapters):
    """The CUDA path's kernels (through Triton's interpreter on CPU) reading the mapping from the step's upload:
    one prefill step of the base and an adapter, then one decode step of both (slow interpreted: two tokens)."""
    from kvmesh.replica.triton_utils import triton_problem

    engine = make_engine(stories_path, max_loras=2)
    if (problem := triton_problem(engine.model_runner.device)) is not None:
        pytest.skip(problem)
    engine.model_runner.lora.state.use_triton = True
    a1 = next(lora for lora in adapters if lora is not None)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=0)
    for lora in (a1, None):
        engine.add_request(EngineRequest(str(lora), PROMPTS[1], params, lora_request=lora))
    finals = {}
    while len(finals) < 2:
        finals.update({out.request_id: out for out in engine.step() if out.finished})
    for lora in (a1, None):
        ref, out = adapters[lora][1], finals[str(lora)]
        assert out.output_token_ids == ref.tokens[:2]
        assert [lp.logprobs[0] for lp in out.logprobs] == pytest.approx(ref.logprobs[:2], abs=1e-4)


def test_offline_llm_generate_takes_an_adapter_per_prompt(stories_path, adapters):
    from kvmesh.replica.llm import LLM

    a1 = next(lora for lora in adapters if lora is not None)
    llm = LLM(str(stories_path), dtype="float32", device="cpu", kv_cache_memory="4MiB", enable_lora=True,
              max_lora_rank=8)
    outs = llm.generate([PROMPTS[0], PROMPTS[0]], GREEDY, lora_request=[a1, None])
    assert [o.output_token_ids for o in outs] == [adapters[a1][0].tokens, adapters[None][0].tokens]
    with pytest.raises(ValueError, match="one LoRARequest or one per prompt"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=[a1, None])
