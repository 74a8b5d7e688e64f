"""``/v1/responses`` over a server's own chat path: the one implementation of the router and the replica.

    create    the stored conversation of ``previous_response_id`` (the caller's tenant's, else 404) + ``instructions``
              + the input -> a chat request -> the server's chat call (``ChatCall``: the router routes it by its
              rendered prefix like any chat; the replica runs it) -> the Response, whole or as events; stored when
              ``store`` (store.py)
    retrieve  ``GET /v1/responses/{id}``: the tenant's stored Response, else 404
    list      ``GET /v1/responses/{id}/input_items``: its input items, a page of OpenAI's list (input_items.py)
    delete    ``DELETE /v1/responses/{id}``: the same, then gone

An id that is not the caller's tenant's answers 404 "not found" whether another tenant holds it or none does; one of
its own that went for a bound (unused too long, evicted for bytes) answers 404 saying it expired and why. A
database that does not answer is a 503 (a response already computed is answered with ``"store": false``).

A chat error is answered as the Responses API names its fields (``messages`` -> ``input``, ``max_tokens`` ->
``max_output_tokens``, ``response_format`` -> ``text.format``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import JsonValue

from .events import ResponseEvents, sse_data
from .input_items import list_page, stored_items
from .output import assistant_message, from_chat, new_id, response_object
from .request import ResponsesRequest
from .store import Expired, ResponseStore, StoredResponse, StoreUnavailable

PREFIX = "/v1/responses/"
"""``GET`` and ``DELETE`` take the id after it."""
INPUT_ITEMS = "/input_items"
"""``GET PREFIX + id + INPUT_ITEMS`` lists the response's input items."""
CHAT_PARAMS = {"messages": "input", "prompt": "input", "max_tokens": "max_output_tokens",
               "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
               "structured_outputs": "text.format"}
"""A chat error's ``param`` -> the Responses field it came from."""


@dataclass
class Answer:
    """An HTTP answer: ``body``, or ``stream`` (server-sent events)."""

    status: int = 200
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


ChatCall = Callable[[JSONObject], Awaitable[Answer]]
"""The server's chat completion path: a chat request body -> its answer (an error as a ProtocolError or a non-200)."""


def responses_param(param: str | None) -> str | None:
    """A chat error's ``param`` as the Responses field it came from."""
    if param is None:
        return None
    head = param.split(".", 1)[0]
    return CHAT_PARAMS.get(head, param)


def not_found(response_id: str, param: str | None = None) -> ProtocolError:
    """Never a hint that another tenant holds it: the same 404 as for an id never stored."""
    return ProtocolError(f"Response with id '{echo(response_id, 64)}' not found.", 404, param=param)


EXPIRED_BECAUSE = {"unused": "it was not used (stored, read or continued) for longer than the server keeps responses",
                   "tenant_bytes": "your stored responses outgrew their bound and it was the least recently used",
                   "total_bytes": "the server's stored responses outgrew their bound and it was among the least "
                                  "recently used"}
"""``Expired.reason`` -> what its owner is told."""


def expired(response_id: str, gone: Expired, param: str | None = None) -> ProtocolError:
    """What the owner of a response that went for a bound is told (a 404, as OpenAI's SDKs expect of a response
    that is no more)."""
    because = EXPIRED_BECAUSE.get(gone.reason, gone.reason)
    return ProtocolError(f"Response with id '{echo(response_id, 64)}' expired: {because}. Store it again by "
                         "sending its conversation as input.", 404, param=param)


def lookup_error(response_id: str, found: Expired | None, param: str | None = None) -> ProtocolError:
    return expired(response_id, found, param) if isinstance(found, Expired) else not_found(response_id, param)


UNAVAILABLE = "the stored responses' database did not answer; retry shortly"
"""A 503's message when the store raised ``StoreUnavailable`` (what failed is in the router's log)."""


class ResponsesService:
    """Create, retrieve and delete responses (module doc) over ``store``."""

    def __init__(self, store: ResponseStore, model_name: Callable[[], str]) -> None:
        self.store = store
        """Where stored responses live (shared between a router's workers: router/control/workers.py)."""
        self.model_name = model_name
        self._io = ThreadPoolExecutor(1, thread_name_prefix="kvmesh-responses")
        """The store's one thread (SQLite serializes its writes anyway): a flood of requests costs no threads."""

    def close(self) -> None:
        """Release the store (its database connections) once nothing calls it."""
        self._io.shutdown(wait=True)
        self.store.close()

    async def _stored(self, call: Callable, *args: object):
        """``call(*args)`` on the store's thread; a database that does not answer is a 503."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._io, call, *args)
        except StoreUnavailable:
            raise ProtocolError(UNAVAILABLE, 503) from None

    async def retrieve(self, tenant: str, response_id: str) -> JSONObject:
        stored = await self._stored(self.store.get, tenant, response_id)
        if not isinstance(stored, StoredResponse):
            raise lookup_error(response_id, stored)
        return stored.response

    async def input_items(self, tenant: str, response_id: str, params: Mapping[str, str]) -> JSONObject:
        """A page of the tenant's stored response's input items (``params``: the query's limit, order, after)."""
        stored = await self._stored(self.store.get, tenant, response_id)
        if not isinstance(stored, StoredResponse):
            raise lookup_error(response_id, stored)
        return list_page(stored.input_items, params)

    async def delete(self, tenant: str, response_id: str) -> JSONObject:
        deleted = await self._stored(self.store.delete, tenant, response_id)
        if deleted is not True:
            raise lookup_error(response_id, deleted or None)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def create(self, req: ResponsesRequest, tenant: str, chat: ChatCall) -> Answer:
        """Answer ``req`` for ``tenant`` through ``chat`` (module doc)."""
        req.check_supported()
        history: list[JsonValue] = []
        if req.previous_response_id is not None:
            stored = await self._stored(self.store.get, tenant, req.previous_response_id)
            if not isinstance(stored, StoredResponse):
                raise lookup_error(req.previous_response_id, stored, "previous_response_id")
            history = stored.conversation
        model = req.model or self.model_name()
        body, conversation = await _as_chat(req, history)
        try:
            answer = await chat(body)
        except ProtocolError as e:
            raise ProtocolError(e.message, e.status_code, responses_param(e.param)) from None
        if answer.status != 200:  # its headers kept (a 429's Retry-After)
            return Answer(answer.status, renamed_error(answer.body), headers=answer.headers)
        response = response_object(req, new_id("resp"), model)
        if answer.stream is not None:
            return Answer(200, stream=self._events(req, tenant, response, conversation, answer.stream),
                          headers={**answer.headers, "content-type": "text/event-stream", "cache-control": "no-cache"})
        done = await self._keep(req, tenant, from_chat(response, json.loads(answer.body)), conversation)
        return Answer(200, json.dumps(done, ensure_ascii=False).encode(), headers=answer.headers)

    async def _keep(self, req: ResponsesRequest, tenant: str, response: JSONObject,
                    conversation: list[JsonValue]) -> JSONObject:
        """Store ``response`` with its conversation when asked; ``"store": false`` when it exceeds a bound alone."""
        if not req.store or response["status"] == "failed":
            return response
        whole = [*conversation, assistant_message(response["output"])]
        try:
            kept = await self._stored(self.store.put, tenant, response, whole, stored_items(req.input))
        except ProtocolError:  # the database did not answer: the answer is the client's all the same
            kept = False
        return response if kept else {**response, "store": False}

    async def _events(self, req: ResponsesRequest, tenant: str, response: JSONObject, conversation: list[JsonValue],
                      chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The ``response.*`` events of a chat stream (events.py), the finished Response stored before the last."""
        events = ResponseEvents(response)
        try:
            for event in events.start():
                yield event
            try:
                async for data in sse_data(chunks):
                    if isinstance(data.get("error"), dict):
                        for event in events.fail(data["error"]):
                            yield event
                        return
                    for event in events.chunk(data):
                        yield event
                    if events.client_error is not None:  # the request's own error, as its unstreamed 400
                        for event in events.fail(events.client_error):
                            yield event
                        return
            except ProtocolError as e:
                for event in events.fail(e.to_dict()["error"]):
                    yield event
                return
            except ValueError:  # a chunk that is not JSON: the chat path's failure, told as one
                for event in events.fail({"message": "the answer's stream broke; retry", "code": 502}):
                    yield event
                return
            for event in events.finish():
                yield event
            events.response = await self._keep(req, tenant, events.response, conversation)
            yield events.completed()
        finally:
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()  # a client that left: the chat stream (and its upstream request) ends too


INLINE_ITEMS = 1000
"""Input items converted to chat messages on the event loop; a longer input is converted on a thread (100,000
items take seconds: the loop, a router's probes of its replicas among its work, must keep turning)."""


async def _as_chat(req: ResponsesRequest, history: list[JsonValue]) -> tuple[JSONObject, list[JsonValue]]:
    """The chat request that answers ``req`` and the conversation it continues (``history`` + its input)."""

    def convert() -> tuple[JSONObject, list[JsonValue]]:
        return req.chat_body(history), [*history, *req.input_messages()]

    if isinstance(req.input, list) and len(req.input) > INLINE_ITEMS:
        return await asyncio.to_thread(convert)
    return convert()


def renamed_error(body: bytes) -> bytes:
    """A chat error answer's body with its ``param`` named as the Responses field (anything else as it was: the
    message, the type, a body that is not an OpenAI error)."""
    try:
        decoded = json.loads(body)
        error = decoded["error"]
        param = error.get("param")
    except (ValueError, KeyError, TypeError, AttributeError):
        return body
    if not isinstance(param, str):
        return body
    error["param"] = responses_param(param)
    return json.dumps(decoded).encode()
