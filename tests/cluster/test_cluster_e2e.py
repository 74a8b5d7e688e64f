"""A whole local cluster through HTTP: 2 replica actors of stories260K behind the router.

Runs on the session's Ray instance (``ray_session``); the tests share one cluster and run in
file order: prefix affinity, streaming, a killed replica, status, shutdown.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.fleet.operations import Fleet
from kvmesh.cluster.launch.launcher import ServeCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# ~120 stories260K tokens: 7 full blocks of 16 shared by every request below
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
         "with her friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. "
         "Her mom said, you can keep the ball if you share it. Lily was happy and said thank you. ")


def _free_port_run(n: int) -> int:
    """A base port with n free ports from it (stable event ports: replica i on base + 2i, base + 2i + 1)."""
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


@pytest.fixture(scope="module")
def cluster(ray_session, stories_path, tmp_path_factory):
    config = from_dict({
        "engine": {"model": str(stories_path), "kv_cache_memory": "16MiB", "max_num_batched_tokens": 512},
        "replicas": {"num_replicas": 2, "max_restarts": 2, "http_port": 0, "event_port": _free_port_run(4)},
        "router": {"port": 0, "served_model_name": ["stories", "tiny-stories"]},  # --served-model-name a b
        "ray": {"namespace": f"kvmesh-test-{os.getpid()}", "ready_timeout_s": 240},
    })
    messages: list[str] = []
    records = str(tmp_path_factory.mktemp("cluster-records"))  # its record, as `kvmesh serve` writes one
    serve = ServeCluster(config, report=messages.append, supervise_interval_s=0.5, fleet=Fleet,
                         admin_keys_dir=records)
    try:
        try:
            serve.start()
        except Exception as e:
            pytest.fail(f"cluster did not start: {type(e).__name__}: {e}\nprogress:\n" + "\n".join(messages))
        serve.messages = messages
        yield serve
    finally:
        serve.stop()


def _complete(cluster, prompt: str, max_tokens: int = 4, **extra) -> dict:
    body = {"model": cluster.state.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, **extra}
    response = httpx.post(cluster.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _replica_stats(cluster) -> dict[str, dict]:
    import ray

    return {h.replica_id: ray.get(h.actor.stats.remote(), timeout=30) for h in cluster.state.replicas}


def test_requests_sharing_a_prefix_land_on_the_replica_holding_it(cluster):
    before = _replica_stats(cluster)
    cached = [_complete(cluster, STORY + f"Question {i}: what")["usage"]["prompt_tokens_details"]["cached_tokens"]
              for i in range(4)]
    after = _replica_stats(cluster)
    served = {rid for rid in after if after[rid]["num_prompt_tokens"] > before[rid]["num_prompt_tokens"]}
    assert len(served) == 1, f"requests with one prefix were split over {served}"
    holder = served.pop()
    shared = httpx.post(cluster.url + "/tokenize", json={"prompt": STORY}, timeout=30).json()["count"]
    full_blocks = 16 * ((shared - 1) // 16)  # the last token of STORY may merge with the next word
    assert cached[0] == 0 and all(c >= full_blocks >= 96 for c in cached[1:]), (cached, shared)
    hits = after[holder]["prefix_cache_hits"] - before[holder]["prefix_cache_hits"]
    assert hits == sum(cached)  # the replica's own metrics agree with what clients were told


def test_every_served_name_is_the_model_through_the_router_and_the_first_is_listed(cluster):
    for model in ("stories", "tiny-stories"):  # vLLM's several names: each is accepted
        r = httpx.post(cluster.url + "/v1/completions", json={"model": model, "prompt": STORY, "max_tokens": 2},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"] == model, r.text
    other = httpx.post(cluster.url + "/v1/completions", json={"model": "other", "prompt": STORY}, timeout=60)
    assert other.status_code == 404 and "stories" in other.json()["error"]["message"]
    assert [card["id"] for card in httpx.get(cluster.url + "/v1/models", timeout=30).json()["data"]] == ["stories"]


def test_streaming_returns_sse_chunks_then_done(cluster):
    body = {"model": cluster.state.served_model_name, "prompt": STORY, "max_tokens": 6, "stream": True,
            "temperature": 0.0}
    chunks = []
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[len("data: "):])
    assert chunks[-1] == "[DONE]"
    texts = [json.loads(c)["choices"][0]["text"] for c in chunks[:-1] if json.loads(c)["choices"]]
    assert len(texts) >= 2 and "".join(texts)


def test_killed_replica_does_not_fail_requests_sent_after_it_died(cluster):
    victim = cluster.state.replicas[0]
    os.kill(victim.endpoints["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _zombie(victim.endpoints["pid"]):  # dead: its sockets are closed (reaped or not)
        assert time.monotonic() < deadline, "the killed replica's process is still running"
        time.sleep(0.02)
    for i in range(6):  # every one must succeed: the router routes around the dead replica
        _complete(cluster, f"Request {i} after the crash. " + STORY[:80])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (victim.restarts_seen >= 1 and victim.up):
        time.sleep(0.5)
    assert victim.restarts_seen >= 1 and victim.up, "Ray did not restart the replica (or serve missed it)"
    assert any("back at" in m for m in cluster.messages)


def test_restarted_replica_gets_an_empty_tree_rebuilt_from_its_new_event_stream(cluster):
    from kvmesh.cluster.router_client import RouterClient

    client = RouterClient(cluster.url, admin_key=cluster.state.admin_key)  # the replica list is the admin plane's
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = {r.replica_id: r for r in client.status()}
        if all(r.healthy for r in rows.values()):
            break
        time.sleep(0.3)
    assert all(r.healthy for r in rows.values()), rows
    assert rows["replica-0"].index_blocks == 0  # its cache was announced empty (AllBlocksCleared)

    # The new incarnation's event stream feeds the router's tree again: fill its cache directly.
    victim = cluster.state.replicas[0]
    body = {"model": cluster.state.served_model_name, "prompt": STORY, "max_tokens": 2}
    internal = {"Authorization": f"Bearer {cluster.router_config().internal_key}"}  # a replica takes only the router's
    assert httpx.post(victim.endpoints["http_url"] + "/v1/completions", json=body, headers=internal,
                      timeout=60).status_code == 200
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and {r.replica_id: r for r in client.status()}["replica-0"].index_blocks == 0:
        time.sleep(0.2)
    assert {r.replica_id: r for r in client.status()}["replica-0"].index_blocks >= 6
    client.close()


def test_status_command_shows_every_replica(cluster, capsys, monkeypatch):
    from kvmesh.cluster.cli import main

    monkeypatch.setenv("KVMESH_ADMIN_KEY", cluster.state.admin_key)  # this serve wrote no record: status is told
    assert main(["status", "--url", cluster.url]) == 0
    out = capsys.readouterr().out
    assert "2/2 replicas healthy" in out and "replica-0" in out and "replica-1" in out


def test_compare_policies_runs_against_the_cluster_and_reads_its_private_events(cluster, tmp_path, monkeypatch):
    """``kvmesh bench compare-policies --url`` against a serve cluster: its routers reach the replicas (which take
    their own router's key only) and subscribe to their CURVE event streams with the credentials of the record."""
    from kvmesh.cluster.measure.loadgen.compare import main
    from kvmesh.router.control.router_server import RouterServer

    assert cluster.config.replicas.private_events  # serve's default: the streams a stranger cannot read
    monkeypatch.setenv("KVMESH_CLUSTERS_DIR", cluster.admin_keys_dir)
    learned: dict[str, int] = {}
    stop = RouterServer.stop

    def stop_and_count(server):  # each policy's router: the blocks its index learned from the events
        learned[server.runtime.config.policy] = server.runtime.router.index.num_blocks()
        return stop(server)

    monkeypatch.setattr(RouterServer, "stop", stop_and_count)
    out = tmp_path / "compare.json"
    assert main(["--url", cluster.url, "--policies", "cache_aware,round_robin", "--workloads", "chatbot",
                 "--num-requests", "8", "--max-tokens", "4", "--settle", "0.5", "--out", str(out), "--no-plot",
                 "--no-progress"]) == 0
    summaries = json.loads(out.read_text())["summaries"]
    for policy in ("cache_aware", "round_robin"):
        run = summaries[policy]["chatbot"]
        assert run["ok"] == run["requests"] > 0 and run["errors"] == 0, run["error_samples"]
        assert learned[policy] > 0, f"the {policy} router learned no block from the replicas' events"


def test_event_ports_are_the_base_plus_2i_even_after_a_restart(cluster):
    base = cluster.config.replicas.event_port
    for i, handle in enumerate(cluster.state.replicas):
        assert handle.endpoints["events_endpoint"].endswith(f":{base + 2 * i}")
        assert handle.endpoints["replay_endpoint"].endswith(f":{base + 2 * i + 1}")
        assert handle.endpoints["events_topic"] == ""  # vLLM's default: vllm-router subscribes to it


def test_cluster_shuts_down_with_no_leftover_processes(cluster):
    import ray

    pids = [ray.get(h.actor.endpoints.remote(), timeout=30)["pid"] for h in cluster.state.replicas]
    url = cluster.url
    cluster.stop()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and not _zombie(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
