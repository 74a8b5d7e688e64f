"""What a caller is told of a stored response that is not there (replica/openai/responses_api/service.py): its owner
learns that it expired and why; any other tenant gets the 404 of an id never stored; a database that does not
answer is a 503 for a read, and an answer already computed is sent with ``"store": false``."""

from __future__ import annotations

import asyncio
import json

import pytest
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from kvmesh.replica.openai.responses_api.service import Answer, ResponsesService
from kvmesh.replica.openai.responses_api.sqlite_store import SQLiteResponseStore
from kvmesh.replica.openai.responses_api.store import StoreUnavailable
from kvmesh.replica.serving.errors import ProtocolError

CHAT = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1}}


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def service(clock: Clock, **bounds) -> ResponsesService:
    return ResponsesService(SQLiteResponseStore(FrontendConfig(**bounds), clock=clock), lambda: "m")


def create(svc: ResponsesService, tenant: str, **body) -> dict:
    async def chat(_: dict) -> Answer:
        return Answer(200, json.dumps(CHAT).encode())

    async def go() -> Answer:
        return await svc.create(parse_request(ResponsesRequest, {"input": "x", **body}), tenant, chat)

    return json.loads(asyncio.run(go()).body)


def refused(call) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        asyncio.run(call)
    return e.value


def test_an_expired_response_says_so_to_its_owner_only():
    clock = Clock()
    svc = service(clock, responses_max_age_s=60)
    old = create(svc, "ann")["id"]
    clock.now += 61
    own = refused(svc.retrieve("ann", old))
    assert own.status_code == 404 and "expired" in own.message and "not used" in own.message
    other = refused(svc.retrieve("bob", old))
    never = refused(svc.retrieve("bob", "resp_never_stored"))
    assert other.status_code == never.status_code == 404
    assert other.message.replace(old, "ID") == never.message.replace("resp_never_stored", "ID")
    assert "expired" not in other.message
    continued = refused(svc.create(parse_request(ResponsesRequest, {"input": "x", "previous_response_id": old}),
                                   "ann", None))
    assert continued.param == "previous_response_id" and "expired" in continued.message


def test_an_evicted_response_says_which_bound_evicted_it():
    clock = Clock()
    svc = service(clock, responses_max_bytes_per_tenant=1200)
    first = create(svc, "ann")["id"]
    for _ in range(6):
        clock.now += 1
        create(svc, "ann")
    told = refused(svc.retrieve("ann", first))
    assert told.status_code == 404 and "your stored responses outgrew their bound" in told.message
    assert "expired" not in refused(svc.retrieve("bob", first)).message


class DownStore(SQLiteResponseStore):
    def get(self, tenant, response_id):
        raise StoreUnavailable("PostgreSQL: OperationalError")

    def put(self, tenant, response, conversation, input_items=None):
        raise StoreUnavailable("PostgreSQL: OperationalError")


def test_a_database_that_does_not_answer_is_a_503_and_an_answer_is_not_lost():
    svc = ResponsesService(DownStore(FrontendConfig()), lambda: "m")
    down = refused(svc.retrieve("ann", "resp_x"))
    assert down.status_code == 503 and "retry" in down.message
    answered = create(svc, "ann")
    assert answered["output"][0]["content"][0]["text"] == "hi" and answered["store"] is False
