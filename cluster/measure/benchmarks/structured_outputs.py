"""What structured outputs cost: ``python -m kvmesh.cluster.measure.benchmarks.structured_outputs``
(results/structured_outputs.json).

Mask: one sampling step of N rows on [N, ``--vocab``] logits, every row constrained by a JSON schema (xgrammar over a
synthetic vocabulary of that size): the engine thread filling the rows' token bitmask (``fill_ms``), then the
runner's part -- the bitmask to the device, -inf where it forbids, the greedy sampler (``masked_ms``) -- against
the same sampler on unconstrained rows (``plain_ms``). Median wall ms per step over ``--repeats`` rounds of
``--steps`` steps, at each batch size.

Throughput: the real engine on ``--model`` (stories260K by default), ``--requests`` requests of ``--max-tokens``
tokens each, all at once, greedy: constrained by a regex that never completes before ``--max-tokens`` against the
same requests unconstrained (``ignore_eos``); generated tokens per second of wall time, median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from kvmesh.replica.engine.engine_request import EngineRequest

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "mood": {"enum": ["happy", "sad"]}, "ok": {"type": "boolean"}},
          "required": ["name", "age", "mood", "ok"], "additionalProperties": False}
FIRST_CHAR = 32
"""The synthetic vocabulary's token i < 95 is the character chr(FIRST_CHAR + i)."""
WORDS = r"( [a-z]+){512,}"  # at least 512 words: never complete within a benchmark's max_tokens


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="python -m kvmesh.cluster.measure.benchmarks.structured_outputs",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/structured_outputs.json")
    p.add_argument("--batch-sizes", default="1,32,256")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--model", default="/work/shared/models/stories260K/hf")
    p.add_argument("--requests", default="1,16", help="concurrent requests of the throughput runs")
    p.add_argument("--max-tokens", type=int, default=64)
    return p.parse_args(argv)


def synthetic_compiler(vocab: int):
    """An xgrammar compiler over ``vocab`` tokens: the printable ASCII characters, then pieces of 2-6 of them."""
    import random

    import xgrammar as xgr

    rng = random.Random(0)
    pieces = [chr(b) for b in range(FIRST_CHAR, 127)] + ["<s>", "</s>"]
    seen = set(pieces)
    while len(pieces) < vocab:
        piece = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz {}\":,0123456789") for _ in range(rng.randint(2, 6)))
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    info = xgr.TokenizerInfo(pieces, stop_token_ids=[pieces.index("</s>")])
    return xgr.GrammarCompiler(info, max_threads=1)


def mask_step_ms(num_rows: int, compiler, args, device) -> dict[str, float]:
    import torch
    from kvmesh.replica.engine.xgrammar_backend import (
        BitmaskFiller,
        GrammarMatcher,
        allocate_bitmask,
        as_numpy,
    )
    from kvmesh.replica.sample.grammar_mask import grammar_rows
    from kvmesh.replica.sample.sampler import Sampler, SamplingMetadata
    from kvmesh.replica.step.scheduler_output import GrammarBitmask

    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matchers = [GrammarMatcher(compiled) for _ in range(num_rows)]
    for m in matchers:  # inside the first string value, where most tokens are allowed
        assert all(m.accept(ord(ch) - FIRST_CHAR) for ch in '{"name": "')  # one token per character
    filler = BitmaskFiller(1)  # the engine's default (StructuredOutputsConfig.fill_threads)
    ids = [f"r{i}" for i in range(num_rows)]
    logits = torch.randn(num_rows, args.vocab, device=device)
    sampler, plain = Sampler(), SamplingMetadata(None, None, None, None, None)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def fill() -> GrammarBitmask:
        bitmask = allocate_bitmask(num_rows, args.vocab)
        filler.fill(matchers, bitmask)
        return GrammarBitmask(ids, as_numpy(bitmask))

    def masked(grammar: GrammarBitmask) -> torch.Tensor:
        md = SamplingMetadata(None, None, None, None, None)
        md.grammar = grammar_rows(grammar, ids, device)
        return sampler(logits, md)

    grammar = fill()
    masked(grammar), sampler(logits, plain)  # warm-up
    timings = {}
    for name, run in (("fill_ms", fill), ("masked_ms", lambda: masked(grammar)),
                      ("plain_ms", lambda: sampler(logits, plain))):
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            run()
        sync()
        timings[name] = 1e3 * (time.perf_counter() - start) / args.steps
    return timings


def throughput(num_requests: int, constrained: bool, args) -> float:
    """Generated tokens per second of ``num_requests`` requests run to the end, all added at once."""
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

    engine = LLMEngine(EngineConfig(model=args.model, dtype="float32", device=args.device, kv_cache_memory=64 << 20,
                                    max_num_seqs=max(num_requests, 1)))
    so = StructuredOutputsParams(regex=WORDS) if constrained else None
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, structured_outputs=so)
    engine.add_request(EngineRequest("warm", [1, 403, 407],
                                     params))  # compiles the grammar (cached by its spec) and warms up
    while engine.has_unfinished_requests():
        engine.step()
    for i in range(num_requests):
        engine.add_request(EngineRequest(f"r{i}", [1, 403, 407, 261 + i], params))
    start, tokens = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    seconds = time.perf_counter() - start
    engine.close()
    assert tokens == num_requests * args.max_tokens, tokens
    return tokens / seconds


def main(argv=None) -> dict:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    compiler = synthetic_compiler(args.vocab)
    raw: dict[str, list] = {}
    for r in range(args.repeats):
        for n in sizes:
            raw.setdefault(f"mask@{n}", []).append(mask_step_ms(n, compiler, args, device))
            print(f"repeat {r} batch {n}: {raw[f'mask@{n}'][-1]}", flush=True)
    mask = {n: {k: statistics.median(t[k] for t in raw[f"mask@{n}"]) for k in ("fill_ms", "masked_ms", "plain_ms")}
            for n in sizes}
    for row in mask.values():
        row["added_ms"] = row["fill_ms"] + row["masked_ms"] - row["plain_ms"]
    counts = [int(s) for s in args.requests.split(",")]
    for r in range(args.repeats):
        for n in counts:
            for constrained in (False, True):  # interleaved, so drift hits both alike
                key = f"{'regex' if constrained else 'free'}@{n}"
                raw.setdefault(key, []).append(throughput(n, constrained, args))
                print(f"repeat {r} requests {n} {key}: {raw[key][-1]:.0f} tokens/s", flush=True)
    rates = {n: {k: statistics.median(raw[f"{k}@{n}"]) for k in ("free", "regex")} for n in counts}
    for row in rates.values():
        row["ratio"] = row["regex"] / row["free"]
    results = {"args": vars(args), "device": str(device), "torch_threads": torch.get_num_threads(),
               "load_avg_end": os.getloadavg(), "mask_step_ms": mask, "tokens_per_s": rates, "raw": raw}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps({"mask_step_ms": mask, "tokens_per_s": rates}, indent=2))
    return results


if __name__ == "__main__":
    main()
