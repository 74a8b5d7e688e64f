"""Streaming OpenAI client for the load generator: one request -> one :class:`RequestResult`.

Timing comes from the SSE stream: TTFT = first chunk carrying generated text, inter-token
latency = gaps between later text chunks (a chunk carrying several tokens counts once), E2E =
until ``data: [DONE]``. Token counts and cached prompt tokens come from the final ``usage``
chunk (``stream_options.include_usage``), falling back to counting chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp
from kvmesh.router.routing.receipts import receipt_headers

HTTP_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
"""What a request can raise short of an answer (refused, reset, timed out)."""


def open_session(base_url: str, headers: dict | None = None, read_timeout_s: float | None = None,
                 total_s: float | None = None) -> aiohttp.ClientSession:
    """The load generator's HTTP client: no connection limit, 5 s to connect, ``read_timeout_s``
    between reads of an answer, ``total_s`` for a whole request (None: no limit)."""
    timeout = aiohttp.ClientTimeout(total=total_s, sock_connect=5.0, sock_read=read_timeout_s)
    return aiohttp.ClientSession(base_url=base_url, headers=headers, timeout=timeout,
                                 connector=aiohttp.TCPConnector(limit=0))


async def get_json(client: aiohttp.ClientSession, path: str) -> tuple[int, object]:
    """(status, parsed body; None when not JSON) of ``GET path``."""
    async with client.get(path) as resp:
        raw = await resp.read()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, None


class EndpointUnreachable(RuntimeError):
    """The server cannot be reached at all (refused, DNS, timeout on connect)."""


@dataclass(slots=True)
class RequestResult:
    session_id: str
    turn: int
    start_s: float = 0.0
    """Send time, seconds from the start of the run."""
    ok: bool = False
    status: int = 0
    error: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    receipt: dict[str, str] = field(default_factory=dict)
    """The route receipt's headers (``x-kvmesh-*``, lower-cased; empty unless the run asked for them)."""
    text: str = ""
    model: str = ""
    """The "model" the request named (an adapter of the ``lora`` workload, or the run's model)."""

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__ if k not in ("text", "itl_s")}
        d["itl_mean_s"] = sum(self.itl_s) / len(self.itl_s) if self.itl_s else None
        return d


def _error_message(status: int, raw: bytes) -> str:
    try:
        err = json.loads(raw)["error"]
        return f"HTTP {status}: {err.get('message', err)}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {raw[:200].decode(errors='replace')}"


def _chunk_text(chunk: dict) -> str:
    parts = []
    for choice in chunk.get("choices") or ():
        if "text" in choice:
            parts.append(choice.get("text") or "")
        else:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def _is_token_chunk(chunk: dict, text: str) -> bool:
    """Whether a chunk marks generated tokens: usage-only chunks, chat role/empty deltas and the
    closing finish_reason chunk do not; an empty completions ``text`` with no finish_reason does
    (the server's detokenizer held back an incomplete character)."""
    choices = chunk.get("choices") or ()
    if text:
        return True
    return any("text" in c and c.get("finish_reason") is None for c in choices)


def _finishes(chunk: dict) -> bool:
    """Whether a chunk carries a choice's ``finish_reason``."""
    return any(c.get("finish_reason") is not None for c in chunk.get("choices") or ())


async def send_streaming(client: aiohttp.ClientSession, path: str, body: dict, result: RequestResult,
                         t0: float) -> RequestResult:
    """POST ``body`` to ``path`` with ``stream: true`` and fill ``result`` (never raises for HTTP errors)."""
    start = time.perf_counter()
    result.start_s = start - t0
    last = None
    pieces: list[str] = []
    num_chunks = 0
    usage = None
    try:
        async with client.post(path, json=body) as resp:
            result.status = resp.status
            result.receipt = receipt_headers(resp.headers)
            if resp.status != 200:
                result.error = _error_message(resp.status, await resp.read())
                return result
            async for raw_line in resp.content:  # one SSE line at a time
                if not raw_line.startswith(b"data:"):
                    continue
                data = raw_line[5:].decode().strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    result.error = f"stream error: {err.get('message', err) if isinstance(err, dict) else err}"
                    return result
                if chunk.get("usage"):
                    usage = chunk["usage"]
                text = _chunk_text(chunk)
                if not _is_token_chunk(chunk, text) and not (last is None and _finishes(chunk)):
                    continue  # a finish is the first output when no text came before (an EOS, held-back bytes)
                now = time.perf_counter()
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
                num_chunks += 1
                pieces.append(text)
    except aiohttp.ClientConnectorError as e:
        result.error = f"connection failed: {e}"
        return result
    except (*HTTP_ERRORS, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e_s = time.perf_counter() - start
    result.text = "".join(pieces)
    if usage:
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = int(details.get("cached_tokens") or 0)
    else:
        result.completion_tokens = num_chunks
    result.ok = result.ttft_s is not None or result.completion_tokens == 0
    if not result.ok:
        result.error = "stream ended without any generated token"
    return result


async def preflight(client: aiohttp.ClientSession, base_url: str, model: str | None, timeout_s: float = 5.0) -> str:
    """Check the endpoint answers ``GET /v1/models``; returns the model to use. Fails fast."""
    try:
        async with client.get("/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status, raw = resp.status, await resp.read()
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
        raise EndpointUnreachable(
            f"cannot connect to {base_url} ({e or type(e).__name__}); is the server running? "
            "Start a cluster with `kvmesh serve` or pass the right --url") from None
    except HTTP_ERRORS as e:
        raise EndpointUnreachable(f"{base_url} did not answer GET /v1/models within {timeout_s:.0f} s "
                                  f"({type(e).__name__}); is it an OpenAI-compatible server?") from None
    if status == 401:
        raise EndpointUnreachable(f"{base_url} refused the request (401): pass --api-key")
    if status != 200:
        if model:
            return model
        raise EndpointUnreachable(f"GET {base_url}/v1/models answered {status}; pass --model")
    if model:
        return model
    try:
        return json.loads(raw)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise EndpointUnreachable(f"{base_url}/v1/models lists no model; pass --model") from None


async def measure_tokens_per_word(client: aiohttp.ClientSession, model: str, sample: str) -> float | None:
    """Tokens per word of ``sample`` according to the server's ``POST /tokenize``; None if unsupported."""
    try:
        async with client.post("/tokenize", json={"model": model, "prompt": sample},
                               timeout=aiohttp.ClientTimeout(total=10.0)) as resp:
            if resp.status != 200:
                return None
            data = json.loads(await resp.read())
        count = data.get("count") or len(data.get("tokens") or [])
    except (*HTTP_ERRORS, ValueError, AttributeError):
        return None
    return count / max(1, len(sample.split())) if count else None
