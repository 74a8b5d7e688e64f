"""Replica CPU saved by tokenizing once (``python -m kvmesh.cluster.measure.benchmarks.tokenize_once``).

A ``kvmesh replica`` subprocess (stories260K) gets the bodies a router forwards to it, with
``forward_token_ids`` on (completions: ``prompt`` as the router's ids; chat: ``prompt_token_ids``) and
off (the client's text, which the replica tokenizes / renders itself). The bodies are built by the
router's own code (router/http/token_forwarding.py) from the router's tokenizer. Rounds alternate on/off;
each request's prompt is already cached, so the engine work (one token) is the same in both and the
difference is the replica's tokenizing. Reported per request: the replica process's CPU time (user +
system from /proc) and the client's wall time, plus the router-side CPU of building the rewritten body.

Writes ``results/tokenize_once.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.shared_dir import stories_model

CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
"""stories260K ships no chat template; the same one as the tests'."""
STORY = ("Once upon a time there was a little girl named Lily who loved to play in the park with her big red "
         "ball and her friend the dog")
WORDS = STORY.split(" ")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(stories_model()),
                    help="model directory (its tokenizer is the router's too)")
    ap.add_argument("--prompt-tokens", type=int, default=480, help="tokens per prompt (stories260K's context is 512)")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts, cycled (each cached after its first)")
    ap.add_argument("--requests", type=int, default=200, help="requests per round and variant")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, each variant once per round, alternating")
    ap.add_argument("--out", default="results/tokenize_once.json")
    return ap.parse_args(argv)


def make_prompts(tok, n: int, tokens: int) -> list[str]:
    """``n`` distinct texts of about ``tokens`` tokens each."""
    out = []
    for i in range(n):
        words, text = [f"Story {i}."], ""
        while len(tok.render_completion(text)) < tokens:
            words.extend(WORDS[(len(words) + i) % len(WORDS)] for _ in range(8))
            text = " ".join(words)
        out.append(text)
    return out


def bodies(tok, texts: list[str], chat: bool) -> dict[bool, list[bytes]]:
    """forwarding on/off -> the bytes a router sends a kvmesh replica for each prompt."""
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.http.token_forwarding import KVMESH

    out: dict[bool, list[bytes]] = {True: [], False: []}
    for text in texts:
        raw = ({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
        raw.update(max_tokens=1, temperature=0)
        req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(raw)
        ids = tok.render_chat(req.template_messages()) if chat else tok.render_completion(text)
        for on in (True, False):
            out[on].append(ProxyRequest(dict(raw), req, [ids], chat, on).for_kind(KVMESH))
    return out


def rewrite_cost_us(tok, texts: list[str], chat: bool, n: int = 300) -> float:
    """Router CPU (us) to build one rewritten body (the client's decoded JSON object with the ids set, encoded)."""
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.http.token_forwarding import KVMESH

    raw = {"messages": [{"role": "user", "content": texts[0]}]} if chat else {"prompt": texts[0]}
    req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(raw)
    ids = list(range(1, 481))
    t0 = time.process_time()
    for _ in range(n):
        ProxyRequest(raw, req, [ids], chat, True).for_kind(KVMESH)
    return (time.process_time() - t0) / n * 1e6


def render_cost_us(tok, texts: list[str], chat: bool, n: int = 100) -> dict[str, float]:
    """In-process CPU (us) of what the replica does per prompt: render the text, or range-check the ids."""
    ids = tok.render_completion(texts[0])
    messages = [{"role": "user", "content": texts[0]}]
    render = (lambda: tok.render_chat(messages)) if chat else (lambda: tok.render_completion(texts[0]))
    out = {}
    for label, fn in (("text", render), ("ids", lambda: tok.render_completion(ids))):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        out[label] = (time.process_time() - t0) / n * 1e6
    return out


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class SequentialClient:
    """One keep-alive HTTP/1.1 connection (stdlib): all a sequential benchmark needs."""

    def __init__(self, url: str) -> None:
        import http.client
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def post(self, path: str, body: bytes) -> bytes:
        self.connection.request("POST", path, body=body, headers={"content-type": "application/json"})
        response = self.connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST {path} answered {response.status}: {data[:200]!r}")
        return data

    def close(self) -> None:
        self.connection.close()


def run_round(client: SequentialClient, pid: int, path: str, payloads: list[bytes], n: int) -> tuple[float, float]:
    """(replica CPU ms, client wall ms) per request over ``n`` requests."""
    cpu0, t0 = proc_cpu_s(pid), time.perf_counter()
    for i in range(n):
        client.post(path, payloads[i % len(payloads)])
    return (proc_cpu_s(pid) - cpu0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3


def main(argv: list[str] | None = None) -> dict:
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    args = parse_args(argv)
    tok = load_tokenizer(args.model, chat_template=CHAT_TEMPLATE)
    texts = make_prompts(tok, args.prompts, args.prompt_tokens)
    cmd = [sys.executable, "-m", "kvmesh.cluster.cli", "replica", "--model", args.model, "--port", "0",
           "--event-port", "none", "--kv-cache-memory", str(16 << 20), "--chat-template", CHAT_TEMPLATE]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"replica did not start: {' '.join(cmd)}")
        url = json.loads(line)["http_url"]
        results: dict = {"prompt_tokens": len(tok.render_completion(texts[0])), "requests_per_round": args.requests,
                         "rounds": args.rounds, "workloads": {}}
        client = SequentialClient(url)
        try:
            for name, chat in (("completions", False), ("chat", True)):
                path = "/v1/chat/completions" if chat else "/v1/completions"
                payloads = bodies(tok, texts, chat)
                for on in (True, False):  # warm: every prompt cached, connections open
                    run_round(client, proc.pid, path, payloads[on], len(texts))
                samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
                for rnd in range(args.rounds):
                    for on in ((True, False) if rnd % 2 == 0 else (False, True)):
                        samples[on].append(run_round(client, proc.pid, path, payloads[on], args.requests))
                    print(f"{name} round {rnd + 1}/{args.rounds}", file=sys.stderr)
                row = {}
                for on, label in ((True, "forward_on"), (False, "forward_off")):
                    row[label] = {"replica_cpu_ms": statistics.median(c for c, _ in samples[on]),
                                  "wall_ms": statistics.median(w for _, w in samples[on]),
                                  "replica_cpu_ms_rounds": [round(c, 3) for c, _ in samples[on]]}
                row["replica_cpu_saved_ms"] = row["forward_off"]["replica_cpu_ms"] - row["forward_on"]["replica_cpu_ms"]
                row["router_rewrite_cpu_us"] = rewrite_cost_us(tok, texts, chat)
                row["replica_render_cpu_us"] = render_cost_us(tok, texts, chat)
                results["workloads"][name] = row
        finally:
            client.close()
    finally:
        proc.terminate()
        proc.wait(10)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
