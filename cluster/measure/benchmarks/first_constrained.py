"""What a replica's first constrained request waits for, and what its start costs:
``python -m kvmesh.cluster.measure.benchmarks.first_constrained`` (results/first_constrained.json).

Each round starts ``kvmesh replica`` on ``--model`` (stories260K by default) as a user would, and reads the CPU
seconds of its process tree once it serves (``start_cpu_s``: what every replica pays, constrained requests or
not); then it sends one plain chat request (``plain_s``: the engine's own first-request costs, paid before), one
with a ``json_schema`` response format (``first_s``, wall seconds), one with another schema (``second_s``: a
compile with the compile processes running), each ``--max-tokens`` long, and stops it. ``--kvmesh`` takes
several ``kvmesh`` executables (say a checkout's and another's), run in turn within each round, so drift and the
machine's other load hit each alike; medians per executable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def parse_args(argv):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0],
                                prog="python -m kvmesh.cluster.measure.benchmarks.first_constrained")
    p.add_argument("--out", default="results/first_constrained.json")
    p.add_argument("--model", default="/work/shared/models/stories260K/hf")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--kvmesh", default=str(Path(sys.executable).parent / "kvmesh"),
                   help="comma-separated kvmesh executables, each measured once per round")
    return p.parse_args(argv)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants."""
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def chat(url: str, max_tokens: int, schema: dict | None) -> float:
    """Wall seconds of one chat request, ``schema`` its json_schema response format (it must answer 200; JSON,
    where it ended by itself)."""
    body = {"model": "s", "messages": [{"role": "user", "content": "Tell me about a person."}],
            "max_tokens": max_tokens, "temperature": 0}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    start = time.perf_counter()
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:  # raises on a status other than 2xx
        answer = json.loads(response.read())
    seconds = time.perf_counter() - start
    choice = answer["choices"][0]
    if schema is not None and choice["finish_reason"] == "stop":
        json.loads(choice["message"]["content"])
    return seconds


def one_round(kvmesh: str, args) -> dict[str, float]:
    cmd = [kvmesh, "replica", "--model", args.model, "--port", "0", "--event-port", "none", "--served-model-name", "s",
           "--kv-cache-memory", str(8 << 20), "--chat-template",
           "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the replica did not start: {' '.join(cmd)}")
        url = json.loads(line)["http_url"]
        start_cpu = tree_cpu_s(proc.pid)
        plain = chat(url, args.max_tokens, None)
        first = chat(url, args.max_tokens, SCHEMA)
        second = chat(url, args.max_tokens, {**SCHEMA, "required": ["age", "name"]})
        return {"start_cpu_s": start_cpu, "plain_s": plain, "first_s": first, "second_s": second,
                "cpu_after_s": tree_cpu_s(proc.pid)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write(args, raw: dict[str, list[dict]]) -> dict:
    """The results file of the rounds so far (written after each: a run stopped midway keeps what it measured)."""
    medians = {k: {m: statistics.median(row[m] for row in rows) for m in rows[0]} for k, rows in raw.items() if rows}
    results = {"args": vars(args), "cpus": os.cpu_count(), "load_avg_end": os.getloadavg(), "median": medians,
               "raw": raw}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    executables = args.kvmesh.split(",")
    raw: dict[str, list[dict]] = {k: [] for k in executables}
    results: dict = {}
    for r in range(args.rounds):
        for kvmesh in executables:  # interleaved: the machine's other load hits each alike
            raw[kvmesh].append(one_round(kvmesh, args))
            print(f"round {r} {kvmesh}: {raw[kvmesh][-1]}", flush=True)
            results = write(args, raw)
    print(json.dumps(results["median"], indent=2))
    return results


if __name__ == "__main__":
    main()


def table(result: dict) -> str:
    """The medians as a Markdown table, a row per ``--kvmesh`` executable in the order given (``kvmesh bench
    report``'s ``first_constrained`` kind); the CPU of the three requests is each round's tree CPU after them less
    its start CPU, the median over the rounds."""
    rows = ["| `--kvmesh` | rounds | start CPU | plain | first constrained | second constrained | CPU of the 3 |",
            "|---|---|---|---|---|---|---|"]
    for n, (kvmesh, runs) in enumerate(result["raw"].items(), 1):
        med = result["median"][kvmesh]
        cpu = statistics.median(r["cpu_after_s"] - r["start_cpu_s"] for r in runs)
        rows.append(f"| {n} | {len(runs)} | {med['start_cpu_s']:.1f} s | {med['plain_s']:.1f} s "
                    f"| {med['first_s']:.1f} s | {med['second_s']:.1f} s | {cpu:.1f} s |")
    return "\n".join(rows) + "\n"
