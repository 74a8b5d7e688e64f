"""Speculative decoding (n-gram, draft model) against plain decoding: ``kvmesh bench spec-decode``
(results/spec_decode_cpu.json).

One engine per variant (stories260K unless ``--model``; prefix caching off, so each round computes the same
work): plain decoding, n-gram drafts, and a draft model's drafts (``--draft-model``, the target itself unless
given: every draft it proposes is the target's own greedy token, so acceptance is its ceiling and each draft
token costs a target forward). Greedy requests, rounds interleaved (plain, n-gram, draft model, plain, ...) so
drift hits all alike. Two
workloads of ``--requests`` concurrent requests of ``--max-tokens`` tokens each:

    recurring   each prompt quotes a text and starts it again (a greedy continuation of a short start, then
                the start): the output repeats the quoted text, so its n-grams recur
    novel       prompts of random tokens: nothing to look up but what the output itself repeats

Reported per workload and variant: median output tokens per second over the rounds, engine steps, and for
the speculative ones the acceptance rate (accepted / drafted tokens) and the mean accepted drafts per draft.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from kvmesh.replica.engine.engine_request import EngineRequest

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SPECULATIVE = ("ngram", "draft_model")
NAMES = {"ngram": "n-gram", "draft_model": "draft model"}


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench spec-decode", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/spec_decode_cpu.json")
    p.add_argument("--model", default="../shared/models/stories260K/hf", help="HF model directory")
    p.add_argument("--draft-model", default=None, help="the draft model's HF directory (default: --model itself)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48,
                   help="output tokens per request (and the quoted text's length)")
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args(argv)


def speculative_configs(args) -> dict[str, dict | None]:
    """variant -> its ``speculative_config`` (None: plain decoding)."""
    draft = {"model": args.draft_model or args.model, "num_speculative_tokens": NGRAM["num_speculative_tokens"]}
    return {"plain": None, "ngram": NGRAM, "draft_model": draft}


def make_engine(args, spec: dict | None):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=args.model, dtype="float32", device=args.device, enable_prefix_caching=False,
                                  speculative_config=spec))


def generate(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[float, int, int]:
    """(seconds, output tokens, steps) of running ``prompts`` to completion together."""
    from kvmesh.replica.serving.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}-{i}", prompt, params))
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
        plain.add_request(EngineRequest(f"quote-{i}", start, _greedy(args.max_tokens)))
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
    configs = speculative_configs(args)
    engines = {variant: make_engine(args, spec) for variant, spec in configs.items()}
    results = {"args": vars(args), "device": args.device, "speculative_config": configs, "workloads": {}}
    for name, prompts in workloads(args, engines["plain"]).items():
        raw = {v: [] for v in engines}
        before = {v: _counts(engines[v]) for v in SPECULATIVE}
        steps = {v: 0 for v in engines}
        for r in range(args.rounds):
            for variant, engine in engines.items():
                seconds, tokens, n = generate(engine, prompts, args.max_tokens, f"{name}-{r}")
                raw[variant].append(tokens / seconds)
                steps[variant] += n
                print(f"{name} round {r} {variant}: {tokens / seconds:.0f} tok/s, {n} steps", flush=True)
        counts = {v: [a - b for a, b in zip(_counts(engines[v]), before[v], strict=True)] for v in SPECULATIVE}
        results["workloads"][name] = {
            "output_tokens_per_s": {v: statistics.median(x) for v, x in raw.items()},
            "steps_per_round": {v: steps[v] / args.rounds for v in engines},
            "acceptance_rate": {v: c[2] / c[1] if c[1] else 0.0 for v, c in counts.items()},
            "accepted_per_draft": {v: c[2] / c[0] if c[0] else 0.0 for v, c in counts.items()},
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
    lines = [f"| workload ({device}) | method | plain tok/s | speculative tok/s | speed-up | acceptance rate "
             "| accepted per draft | steps plain / speculative |", "|---|---|---|---|---|---|---|---|"]
    for name, w in results["workloads"].items():
        tps, steps = w["output_tokens_per_s"], w["steps_per_round"]
        for v in SPECULATIVE:
            lines.append(f"| {name} | {NAMES[v]} | {tps['plain']:.0f} | {tps[v]:.0f} | {tps[v] / tps['plain']:.2f}x "
                         f"| {w['acceptance_rate'][v]:.1%} | {w['accepted_per_draft'][v]:.2f} "
                         f"| {steps['plain']:.0f} / {steps[v]:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
