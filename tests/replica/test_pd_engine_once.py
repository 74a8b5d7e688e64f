"""A P/D request enters the engine once: its ``kv_transfer_params`` ride in its one ``generate`` call into the
scheduler, which holds it while its blocks are read (real stories260K, ``local`` transport).

Over HTTP each side of a split makes one engine call and sends the engine thread one command (its AddRequest):
the decode side's pull and the prefill side's lease are the scheduler's and its connector's work (the holder's
``/kv/lease`` and ``/kv/release`` the decode side calls are the holder's own commands). And a request
cancelled while it waits for its blocks lets them go (its read given up, the blocks quarantined until the
transport confirms the read over, then freed) while the engine keeps serving the others; over HTTP a client that
leaves while its request waits for the peer's answer aborts it, and the lease the peer then grants is let go.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import json
import threading

from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.remote_kv import PullResult, RemoteBlocks, RemoteKV
from kvmesh.replica.engine.request import RequestStatus
from kvmesh.replica.serving.sampling_params import SamplingParams

from ..leaving_client import post_unread
from .kv_replicas import client, kv_replica, register, wait_for
from .test_kv_pull_overlap import GREEDY, PROMPT, STALLED_S, _agents, _engine, _final, _until
from .test_kv_transfer_http import FULL_BLOCK_TOKENS, complete, fresh_prompt


def _count_engine_calls(llm, monkeypatch) -> tuple[list, list[str]]:
    """Record ``llm``'s ``generate`` calls (their ``remote_kv``) and the commands sent to its engine thread."""
    calls, commands = [], []
    generate, submit = llm.generate, llm._submit

    def counted_generate(request, *args, **kwargs):
        calls.append(request.remote_kv)
        return generate(request, *args, **kwargs)

    def counted_submit(command):
        commands.append(type(command).__name__)
        submit(command)

    monkeypatch.setattr(llm, "generate", counted_generate)
    monkeypatch.setattr(llm, "_submit", counted_submit)
    return calls, commands


def test_each_side_of_a_split_makes_one_engine_call_and_sends_one_command(stories_path, monkeypatch):
    prompt = fresh_prompt(61)
    with kv_replica(stories_path, replica_id="a") as a, kv_replica(stories_path, replica_id="b") as b, \
            client(a) as ca, client(b) as cb:
        register(b, a)
        reference = complete(cb, prompt, cache_salt="computed").json()["choices"][0]["text"]
        prefill_calls, prefill_commands = _count_engine_calls(a.state.engine_client, monkeypatch)
        decode_calls, decode_commands = _count_engine_calls(b.state.engine_client, monkeypatch)
        handle = complete(ca, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()
        handle = handle["kv_transfer_params"]
        assert handle["num_tokens"] == FULL_BLOCK_TOKENS and handle["remote_lease_id"]
        assert prefill_commands == ["AddRequest"]  # the lease: taken by the connector as the request finished
        decode = complete(cb, prompt, kv_transfer_params={**handle, "remote_url": a.http.url})
        assert decode.headers["x-kvmesh-kv-pull"] == "ok"
        assert int(decode.headers["x-kvmesh-kv-pulled-tokens"]) == FULL_BLOCK_TOKENS
        assert decode.json()["choices"][0]["text"] == reference
        assert len(prefill_calls) == 1 and prefill_calls[0].lease_ttl_s is not None
        assert len(decode_calls) == 1 and decode_calls[0].remote is not None
        assert decode_commands == ["AddRequest"]  # the pull: the scheduler's, between its steps
        assert prefill_commands == ["AddRequest", "LeaseBlocks", "ReleaseLease"]  # then /kv/lease, /kv/release


class _Holder:
    """A ``RemoteSource`` whose holder answered at once with ``blocks``; records how the pull ended."""

    def __init__(self, blocks: RemoteBlocks) -> None:
        self.blocks, self.results = blocks, []

    def lookup(self) -> concurrent.futures.Future:
        found: concurrent.futures.Future = concurrent.futures.Future()
        found.set_result(self.blocks)
        return found

    def done(self, result: PullResult, error: BaseException | None = None) -> None:
        self.results.append(result)

    async def ended(self) -> None:
        return None


async def test_a_request_cancelled_while_its_blocks_are_read_frees_them_and_the_engine_serves_on(stories_path):
    holder, puller = _engine(stories_path), _engine(stories_path, num_kv_blocks=64)
    holder_agent, agent, peer = _agents(holder, puller, 60.0, "cancelled", "late")  # reads land when told
    try:
        await _final(holder, PROMPT)
        lease = await holder.lease_blocks(PROMPT, None, 60.0)
        source = _Holder(RemoteBlocks(agent, peer, lease.remote_block_ids))
        running = puller.generate([5, 6, 7, 8], SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True),
                                  request_id="running")
        await anext(running)
        waiting = asyncio.ensure_future(
            _collect(puller.generate(EngineRequest("pd", PROMPT, GREEDY, remote_kv=RemoteKV(source)))))
        await _until(lambda: agent.transfers, "the read's start")
        assert puller.engine.scheduler.requests["pd"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert len(puller.kv_transfers.held_blocks()) == 6  # the read's blocks, held by the connector
        produced = 0
        while produced < 10:  # the other request keeps stepping while this one waits
            produced += len((await asyncio.wait_for(anext(running), STALLED_S)).new_token_ids)
        waiting.cancel()  # the client goes away
        await _until(lambda: "pd" not in puller.engine.scheduler.requests, "the abort")
        await _until(lambda: source.results, "the pull's end")
        assert source.results == [PullResult("failed")]  # the holder's lease is let go
        await _until(lambda: agent.transfers[0].aborted, "the read given up")
        assert puller.kv_transfers.quarantined_blocks == 6  # held until the transport confirms the read over
        agent.land.set()
        await _until(lambda: puller.kv_transfers.quarantined_blocks == 0, "the blocks' release")
        assert puller.kv_transfers.held_blocks() == []  # freed, uncached
        assert puller.errored is None and not puller.kv_transfers.remote.loads
        produced += len((await asyncio.wait_for(anext(running), STALLED_S)).new_token_ids)  # still serving
        await running.aclose()
        out = await _final(puller, PROMPT)
        assert out.num_cached_tokens == 0 and out.finish_reason == "length"
        assert await holder.release_lease(lease.lease_id) == 6
    finally:
        agent.close()
        holder_agent.close()
        puller.shutdown()
        holder.shutdown()


async def _collect(stream) -> list:
    return [out async for out in stream]


class _SlowHolder(http.server.BaseHTTPRequestHandler):
    """A peer that answers ``/kv/lease`` (a lease on two blocks) only once ``answer`` is set, and has no handshake
    (the pull then fails); records the paths it was asked."""

    answer = threading.Event()
    seen: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        _SlowHolder.seen.append(self.path)
        if self.path == "/kv/lease":
            _SlowHolder.answer.wait(30)
        data = json.dumps({"lease_id": "held", "remote_block_ids": [1, 2], "num_tokens": 32, "expires_in_s": 30.0}
                          if self.path == "/kv/lease" else {"released_blocks": 2}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_client_that_leaves_while_its_request_waits_for_the_peer_aborts_it_and_the_lease_is_let_go(stories_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowHolder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with kv_replica(stories_path, replica_id="b") as b, client(b) as cb:
            cb.post("/kv/peers", json={"peers": [{"replica_id": "slow", "url": url}]}).raise_for_status()
            llm = b.state.engine_client
            body = {"prompt": fresh_prompt(62), "max_tokens": 4,
                    "kv_transfer_params": {"do_remote_prefill": True, "remote_url": url}}
            with post_unread(b.http.url, "/v1/completions", body, {"Authorization": cb.headers["authorization"]}):
                wait_for(lambda: "/kv/lease" in _SlowHolder.seen, "the request asking the peer for a lease")
            # the client gave up and closed its connection while the request waits for the peer's answer
            assert _SlowHolder.seen == ["/kv/lease"]
            wait_for(lambda: not llm.engine.scheduler.requests, "the waiting request's abort")
            assert complete(cb, fresh_prompt(63), max_tokens=4).status_code == 200  # it serves on
            _SlowHolder.answer.set()  # the peer grants a lease now: nobody will read it
            wait_for(lambda: "/kv/release" in _SlowHolder.seen, "the lease's release")
            assert llm.errored is None and not llm.kv_transfers.remote.loads
    finally:
        server.shutdown()
        server.server_close()
