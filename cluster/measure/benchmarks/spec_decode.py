"""N-gram speculative decoding against plain decoding: ``kvmesh bench spec-decode`` (results/spec_decode_cpu.json).

One engine per variant (stories260K unless ``--model``; prefix caching off, so each round computes the same
work), greedy requests, rounds interleaved (plain, speculative, plain, ...) so drift hits both alike. Two
workloads of ``--requests`` concurrent requests of ``--max-tokens`` tokens each:

    recurring   each prompt quotes a text and starts it again (a greedy continuation of a short start, then
                the start): the output repeats the quoted text, so its n-grams recur
    novel       prompts of random tokens: nothing to look up but what the output itself repeats

Reported per workload and variant: median output tokens per second over the rounds, engine steps, and for
the speculative one the acceptance rate (accepted / drafted tokens) and the mean accepted drafts per draft.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench spec-decode", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/spec_decode_cpu.json")
    p.add_argument("--model", default="../shared/models/stories260K/hf", help="HF model directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48, help="output tokens per request (and the quoted text's length)")
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args(argv)


def make_engine(args, spec: bool):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=args.model, dtype="float32", device=args.device, enable_prefix_caching=False,
                                  speculative_config=SPEC if spec else None))


def generate(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[float, int, int]:
    """(seconds, output tokens, steps) of running ``prompts`` to completion together."""
    from kvmesh.replica.serving.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    start, tokens, steps = time.perf_counter(), 0, 0
    while engine.has_unfinished_requests() and steps < 100 * max_tokens:
        tokens += sum(len(o.new_token_ids) for o in engine.step())
        steps += 1
    return time.perf_counter() - start, tokens, steps


def workloads(args, plain) -> dict[str, list[list[int]]]:
    rng = random.Random(0)
    vocab = plain.vocab_size
    starts = [[1] + [rng.randrange(3, vocab) for _ in range(4)] for _ in range(args.requests)]
    quoted = []
    for i, start in enumerate(starts):
        plain.add_request(f"quote-{i}", start, _greedy(args.max_tokens))
    texts = {}
    while plain.has_unfinished_requests():
        texts.update({o.request_id: o.output_token_ids for o in plain.step() if o.finished})
    quoted = [start + texts[f"quote-{i}"] + start for i, start in enumerate(starts)]
    novel = [[1] + [rng.randrange(3, vocab) for _ in range(len(q) - 1)] for q in quoted]
    return {"recurring": quoted, "novel": novel}


def _greedy(n: int):
    from kvmesh.replica.serving.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


def run(args) -> dict:
    engines = {"plain": make_engine(args, False), "ngram": make_engine(args, True)}
    results = {"args": vars(args), "device": args.device, "speculative_config": SPEC, "workloads": {}}
    for name, prompts in workloads(args, engines["plain"]).items():
        raw = {v: [] for v in engines}
        before = _counts(engines["ngram"])
        steps = {v: 0 for v in engines}
        for r in range(args.rounds):
            for variant, engine in engines.items():
                seconds, tokens, n = generate(engine, prompts, args.max_tokens, f"{name}-{r}")
                raw[variant].append(tokens / seconds)
                steps[variant] += n
                print(f"{name} round {r} {variant}: {tokens / seconds:.0f} tok/s, {n} steps", flush=True)
        after = _counts(engines["ngram"])
        drafts, drafted, accepted = (a - b for a, b in zip(after, before, strict=True))
        results["workloads"][name] = {
            "output_tokens_per_s": {v: statistics.median(x) for v, x in raw.items()},
            "steps_per_round": {v: steps[v] / args.rounds for v in engines},
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_draft": accepted / drafts if drafts else 0.0,
            "raw_tokens_per_s": raw}
    results["load_avg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return results


def _counts(engine) -> tuple[int, int, int]:
    s = engine.scheduler.drafter.stats
    return s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens


def table(results: dict) -> str:
    """BENCHMARKS' speculative decoding table (``kvmesh bench report``'s spec_decode kind)."""
    device = results["device"].upper()
    lines = [f"| workload ({device}) | plain tok/s | n-gram tok/s | speed-up | acceptance rate | accepted per draft "
             "| steps plain / n-gram |", "|---|---|---|---|---|---|---|"]
    for name, w in results["workloads"].items():
        tps, steps = w["output_tokens_per_s"], w["steps_per_round"]
        lines.append(f"| {name} | {tps['plain']:.0f} | {tps['ngram']:.0f} | {tps['ngram'] / tps['plain']:.2f}x "
                     f"| {w['acceptance_rate']:.1%} | {w['accepted_per_draft']:.2f} "
                     f"| {steps['plain']:.0f} / {steps['ngram']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
