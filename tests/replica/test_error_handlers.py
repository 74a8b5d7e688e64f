"""The replica's (and the router's app's) error handlers: a failure nobody planned for answers a 500 that
names a request id, never the exception, whose text may carry internals; the log has the details."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.testclient import TestClient
from kvmesh.replica.openai.errors import install_error_handlers
from kvmesh.replica.serving.errors import ProtocolError


def app_failing_with(error: Exception) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, "replica")

    @app.get("/fail")
    async def fail():
        raise error

    return app


def test_an_unhandled_exception_is_a_500_with_a_request_id_and_no_exception_text(caplog):
    app = app_failing_with(KeyError("/home/ops/.cache/secret-path"))
    with caplog.at_level(logging.ERROR, logger="kvmesh.replica.openai.errors"):
        r = TestClient(app, raise_server_exceptions=False).get("/fail")
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "internal_server_error" and error["code"] == 500
    assert "KeyError" not in r.text and "secret-path" not in r.text, r.text
    request_id = error["message"].split("request id ")[1].split(")")[0]
    (logged,) = [rec for rec in caplog.records if request_id in rec.getMessage()]
    assert "secret-path" in logged.getMessage() and logged.exc_info is not None


def test_a_protocol_error_keeps_its_own_message():
    r = TestClient(app_failing_with(ProtocolError("max_tokens must be positive", 400))).get("/fail")
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens must be positive"
