"""`kvmesh status` HIT RATE counts every request, streams whose client did not ask for usage included
(the router sees no usage then; the replica's own prefix-cache counters count them)."""

from __future__ import annotations

import json

import httpx
from kvmesh.cluster.cli import main

from . import openai_pair
from .openai_pair import AUTH, KEY

pair = openai_pair.pair  # the fixture


def test_status_hit_rate_counts_streams_sent_without_include_usage(pair, tmp_path, monkeypatch, capsys):
    _, router = pair
    prompt = "Once upon a time there was a little girl who loved to play in the park. " * 3
    for _ in range(4):  # the first computes the prompt, the next three find its full blocks cached
        body = {"prompt": prompt, "max_tokens": 4, "stream": True}
        with httpx.stream("POST", router + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and events[-1] == "data: [DONE]"
        assert not any('"usage":{' in e for e in events[:-1] if '"choices":[]' in e)  # no usage asked, none sent
    monkeypatch.setenv("KVMESH_API_KEY", KEY)
    monkeypatch.setenv("KVMESH_ADMIN_KEY", "admin-key")  # the router's (openai_pair.py): the replica list needs it
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", str(tmp_path))
    capsys.readouterr()
    assert main(["status", "--url", router, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["replicas"]
    assert row["hit_rate"] is not None and row["hit_rate"] >= 0.5, row
    assert main(["status", "--url", router]) == 0
    table = capsys.readouterr().out
    assert f"{row['hit_rate']:.0%}" in table.splitlines()[2], table
