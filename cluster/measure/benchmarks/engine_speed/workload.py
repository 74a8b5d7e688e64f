"""The throughput workload: random token-id prompts, all submitted at once, stepped to the end."""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvmesh.cluster.measure.benchmarks.engine_speed.timing import Clock
from kvmesh.replica.engine.engine_request import EngineRequest

FIRST_TOKEN_ID = 3  # below: Llama's <unk>, <s>, </s>


@dataclass(frozen=True)
class SpeedWorkload:
    """Prompts and the number of tokens each request generates (EOS ignored)."""

    prompts: list[list[int]]
    """Prompt token ids per request."""
    output_lens: list[int]
    """Output tokens per request."""

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def random_tokens(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(n)]


def make_workload(seed: int | str, num_requests: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
                  vocab_size: int) -> SpeedWorkload:
    rng = random.Random(seed)
    prompts = [random_tokens(rng, rng.randint(*prompt_len), vocab_size) for _ in range(num_requests)]
    return SpeedWorkload(prompts, [rng.randint(*output_len) for _ in range(num_requests)])


def greedy(max_tokens: int):
    from kvmesh.replica.serving.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def warm_up(engine, vocab_size: int) -> None:
    """A few short requests through prefill and decode: the first calls of every op are not timed."""
    rng = random.Random("warm-up")
    for i in range(4):
        engine.add_request(EngineRequest(f"warm{i}", random_tokens(rng, 32 + 8 * i, vocab_size), greedy(4)))
    while engine.has_unfinished_requests():
        engine.step()


def run_workload(engine, workload: SpeedWorkload, device, label: str) -> dict:
    """Add every request, step until all finish; wall/CPU time, tok/s and CPU ms per output token."""
    from tqdm import tqdm

    clock = Clock(device)
    for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        engine.add_request(EngineRequest(f"w{i}", prompt, greedy(n)))
    steps = generated = 0
    with tqdm(total=workload.output_tokens, desc=f"{label}: workload", unit="tok", leave=False) as bar:
        while engine.has_unfinished_requests():
            new = sum(len(o.new_token_ids) for o in engine.step())
            generated += new
            steps += 1
            bar.update(new)
    times = clock.read()
    if generated != workload.output_tokens:
        raise RuntimeError(f"the engine generated {generated} tokens, the workload asked for {workload.output_tokens}")
    total = workload.prompt_tokens + generated
    return {"num_requests": len(workload.prompts), "prompt_tokens": workload.prompt_tokens,
            "output_tokens": generated, "steps": steps, **times,
            "output_tok_per_s": generated / times["wall_s"], "total_tok_per_s": total / times["wall_s"],
            "cpu_ms_per_output_token": 1000 * times["cpu_s"] / generated}
