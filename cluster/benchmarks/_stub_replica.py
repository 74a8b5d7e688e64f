"""An instant stub replica for router benchmarks and tests: stdlib asyncio HTTP/1.1, no model.

Answers ``POST /v1/completions`` and ``/v1/chat/completions`` with a one-token reply (SSE when the
body asks for ``"stream": true``), ``GET /load`` with an idle load, and any other GET with a 200
JSON that satisfies the health and model probes of kvmesh's, sglang's and vLLM's routers. A
response costs it ~20 µs of CPU, so a router in front of it is measured almost alone::

    python -m kvmesh.cluster.benchmarks._stub_replica --port 0 [--delay-ms 0]   # prints {"port": P}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

COMPLETION = (b'{"id":"cmpl-stub","object":"text_completion","created":0,"model":"stub","choices":'
              b'[{"index":0,"text":"!","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":1,'
              b'"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}')
CHAT = (b'{"id":"chatcmpl-stub","object":"chat.completion","created":0,"model":"stub","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"!"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,'
        b'"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}')
STREAM_CHUNKS = (b'data: {"id":"cmpl-stub","object":"text_completion","created":0,"model":"stub","choices":'
                 b'[{"index":0,"text":"!","finish_reason":"length"}]}\n\n', b"data: [DONE]\n\n")
LOAD = (b'{"num_requests_running":0,"num_requests_waiting":0,"kv_cache_usage":0.0,'
        b'"num_waiting_prefill_tokens":0}')
INFO = (b'{"status":"ok","object":"list","data":[{"id":"stub","object":"model","owned_by":"stub"}],'
        b'"model_path":"stub","tokenizer_path":"stub","is_generation":true}')


def _head(status: bytes, length: int | None, content_type: bytes = b"application/json") -> bytes:
    size = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\n%s\r\n\r\n" % (status, content_type, size)


class StubReplica:
    """Serves the stub protocol on one port until cancelled."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        """Seconds each completion waits before answering (0 = instant)."""
        self.requests = 0
        """Completion requests answered."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)}
                body = await self._body(reader, headers)
                await self._answer(writer, method, path, body)
                if headers.get(b"connection", b"").lower() == b"close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict) -> bytes:
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await reader.readexactly(size + 2))
                if not size:
                    return b"".join(p[:-2] for p in parts)
        length = int(headers.get(b"content-length", b"0"))
        return await reader.readexactly(length) if length else b""

    async def _answer(self, writer: asyncio.StreamWriter, method: bytes, path: bytes, body: bytes) -> None:
        path = path.split(b"?")[0]
        if method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
            self.requests += 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            stream = b'"stream"' in body and json.loads(body).get("stream") is True
            if stream:
                writer.write(_head(b"200 OK", None, b"text/event-stream"))
                for chunk in STREAM_CHUNKS:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                writer.write(b"0\r\n\r\n")
            else:
                reply = CHAT if path == b"/v1/chat/completions" else COMPLETION
                writer.write(_head(b"200 OK", len(reply)) + reply)
        elif method == b"GET":
            reply = LOAD if path == b"/load" else INFO
            writer.write(_head(b"200 OK", len(reply)) + reply)
        else:
            writer.write(_head(b"200 OK", 2) + b"{}")
        await writer.drain()


async def serve(port: int, delay_s: float, host: str = "127.0.0.1") -> None:
    stub = StubReplica(delay_s)
    server = await asyncio.start_server(stub.handle, host, port, backlog=1024)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="port to bind on 127.0.0.1 (0 = free one)")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="wait before each completion answer")
    args = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, args.delay_ms / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
