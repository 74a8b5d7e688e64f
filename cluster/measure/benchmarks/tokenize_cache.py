"""The router's tokenize cache against the plain tokenizer, on the traffic of ``kvmesh bench router-peers``.

    kvmesh bench tokenize_cache [--out results/tokenize_cache.json] [--quick]

Per workload (1,000-token completions sharing 8 prefixes; 32 chats of 8 turns resending their
history, Llama-2 template), CPU microseconds per request to turn the request into token ids:
the plain tokenizer vs ``CachedTokenizer`` (router/routing/tokenize_cache.py), interleaved, warm cache
(every request seen once before, as in a steady state where prefixes and histories recur) and
cold (each distinct request's first sighting, only earlier requests' pieces cached). Every cached
result is checked against the plain one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.router_peers import LLAMA2_CHAT_TEMPLATE, STORIES, workloads


def _per_request_us(fn, requests: list, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for r in requests:
            fn(r)
        samples.append((time.thread_time_ns() - t0) / len(requests) / 1e3)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench tokenize_cache", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/tokenize_cache.json")
    ap.add_argument("--model", default=STORIES, help="tokenizer to measure (default stories260K)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = ap.parse_args(argv)
    from kvmesh.replica.serving.tokenizer import load_tokenizer
    from kvmesh.router.routing.tokenize_cache import CachedTokenizer

    tok = load_tokenizer(args.model, max_model_len=8192, chat_template=LLAMA2_CHAT_TEMPLATE)
    bodies = {w: [json.loads(b) for b in items] for w, items in workloads(tok).items() if w != "token_ids"}
    texts = {"text": [b["prompt"] for b in bodies["text"]],
             "chat": [tok.apply_chat_template(b["messages"]) for b in bodies["chat"]]}
    add = {"text": True, "chat": False}  # completions get BOS from the tokenizer; chat templates hold it
    rounds = 2 if args.quick else 5
    out = {"model": str(args.model), "workloads": {}}
    for name, items in texts.items():
        plain = lambda t, a=add[name]: tok.hf.encode(t, add_special_tokens=a)  # noqa: E731
        cold_cache = CachedTokenizer(tok.hf)
        t0 = time.thread_time_ns()
        cold_ids = [cold_cache.encode(t, add[name]) for t in items]
        cold_us = (time.thread_time_ns() - t0) / len(items) / 1e3
        assert cold_ids == [plain(t) for t in items], "cached ids differ from the tokenizer's"
        warm = CachedTokenizer(tok.hf)
        for t in items:
            warm.encode(t, add[name])
        res = {"requests": len(items), "mean_tokens": statistics.mean(len(plain(t)) for t in items[:64])}
        plain_us, warm_us = [], []
        for _ in range(3):  # interleaved
            plain_us.append(_per_request_us(plain, items, rounds))
            warm_us.append(_per_request_us(lambda t, w=warm, a=add[name]: w.encode(t, a), items, rounds))
        res.update(plain_us=statistics.median(plain_us), cached_warm_us=statistics.median(warm_us),
                   cached_cold_us=cold_us, cached_tokens=warm.cached_tokens,
                   cold_hit_fraction=cold_cache.hit_tokens / max(cold_cache.hit_tokens + cold_cache.miss_tokens, 1))
        out["workloads"][name] = res
        print(f"{name:<5} {res['mean_tokens']:.0f} tokens: plain {res['plain_us']:.0f} us, cached warm "
              f"{res['cached_warm_us']:.0f} us, first sighting {cold_us:.0f} us "
              f"({100 * res['cold_hit_fraction']:.0f}% of tokens from the cache)", flush=True)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0
