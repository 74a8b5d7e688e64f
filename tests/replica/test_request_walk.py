"""Following one completion request from the replica's HTTP socket to the engine call, no file is entered twice;
its answer is rendered by one call from the handler that goes down.

A profiler on the server's threads records the kvmesh frames on the stack at every call of a kvmesh
function from the request's arrival until the engine call (``AsyncLLM.generate``); on no such stack does a
file appear again after another file was entered (``app.py -> completions.py -> app.py`` would be a
walk that goes back and forth). The way back is not part of it: an ASGI response passes up through the
middleware's ``send`` callbacks by design. The answer (reasoning -> tools -> logprobs -> usage) is shaped below
one call of the handler's ``_serve`` (answer_renderer.py), and from the renderer down no file is entered twice
either."""

from __future__ import annotations

import threading
from pathlib import Path
from types import FrameType

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_llm import AsyncLLM
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.completions import OpenAIHandlers
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.worker.fake_runner import FakeModelRunner

from ..conftest import CHAT_TEMPLATE

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = tuple(str(ROOT / name) + "/" for name in ("kvcache", "events", "replica", "router", "cluster"))
ENGINE_CALL = AsyncLLM.generate.__code__
SERVE = OpenAIHandlers._serve.__code__
RENDERER = "replica/server/answer_renderer.py"
ANSWER_SHAPING = {RENDERER, "replica/server/answer.py", "replica/server/chat_render.py",
                  "replica/server/completion_render.py", "replica/server/output_usage.py",
                  "replica/server/chat_tools.py", "replica/openai/logprobs_format.py"}
"""Files that shape an answer (with chat_answer.py's ``message``, ``streams`` and ``delta``)."""


def kvmesh_files(frame: FrameType | None) -> list[str]:
    """The kvmesh files of a stack, outermost first, a run of frames in one file written once."""
    files: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PACKAGES):
            files.append(str(Path(name).relative_to(ROOT)))
        frame = frame.f_back
    walk = [f for i, f in enumerate(reversed(files)) if i == 0 or f != files[len(files) - i]]
    return walk


def reentered(walk: list[str]) -> list[str]:
    """Files that a walk leaves and comes back to."""
    return sorted({f for i, f in enumerate(walk) if f in walk[:i]})


class WalkRecorder:
    """A profile function for the server's threads: every distinct kvmesh stack until the engine call, and that one."""

    def __init__(self) -> None:
        self.walks: set[tuple[str, ...]] = set()
        self.to_engine: list[str] | None = None
        self.recording = False
        self.from_serve: dict[int, tuple[str, str]] = {}  # frame -> (file, function): the kvmesh calls of ``_serve``
        self.answer_walks: set[tuple[str, ...]] = set()  # the walks from the renderer down

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not self.recording or not frame.f_code.co_filename.startswith(PACKAGES):
            return
        here = str(Path(frame.f_code.co_filename).relative_to(ROOT))
        if frame.f_back is not None and frame.f_back.f_code is SERVE:
            self.from_serve[id(frame)] = (here, frame.f_code.co_name)  # a coroutine resumed is one call
        if here in ANSWER_SHAPING or here == "replica/server/chat_answer.py":
            walk = kvmesh_files(frame)
            if RENDERER in walk:
                self.answer_walks.add(tuple(walk[walk.index(RENDERER):]))
        if self.to_engine is not None:
            return
        walk = kvmesh_files(frame)
        self.walks.add(tuple(walk))
        if frame.f_code is ENGINE_CALL:
            self.to_engine = walk


def test_a_walk_that_goes_back_to_a_file_is_caught():
    assert reentered(["replica/server/metrics.py", "replica/server/app.py", "replica/server/completions.py",
                      "replica/server/app.py"]) \
        == ["replica/server/app.py"]
    assert reentered(["replica/server/metrics.py", "replica/openai/auth.py", "replica/server/completions.py"]) == []


@pytest.fixture
def recorded_replica(stories_path):
    recorder = WalkRecorder()
    threading.setprofile(recorder)  # threads started from here on: the HTTP server's, the engine's
    try:
        runtime = ReplicaRuntime.start(EngineConfig(model=str(stories_path)),
                                       ReplicaServerConfig(port=0, event_port=None),
                                       frontend=FrontendConfig(chat_template=CHAT_TEMPLATE),
                                       model_runner=FakeModelRunner(num_kv_blocks=64, vocab_size=512))
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    try:
        yield runtime, recorder
    finally:
        runtime.shutdown(graceful_s=0)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2}),
    ("/v1/completions", {"prompt": [1, 403, 407], "max_tokens": 2, "stream": True}),
    ("/v1/completions", {"prompt": ["Once", "upon"], "max_tokens": 2, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
], ids=["text", "token-ids-streamed", "batch-of-n", "chat"])
def test_one_completion_enters_no_file_twice(recorded_replica, path, body):
    runtime, recorder = recorded_replica
    recorder.recording = True
    reply = httpx.post(runtime.http.url + path, json=body, timeout=60)
    recorder.recording = False
    assert reply.status_code == 200, reply.text
    assert recorder.to_engine is not None and recorder.to_engine[-1] == "replica/engine/async_llm.py"
    if body.get("n", 1) == 1:  # one candidate: one task from the socket on (n > 1: a task per candidate)
        assert "replica/server/completions.py" in recorder.to_engine, recorder.to_engine
    assert {w: reentered(list(w)) for w in recorder.walks if reentered(list(w))} == {}


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2, "echo": True}),
    ("/v1/completions", {"prompt": [1, 403, 407], "max_tokens": 2, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
                              "stream_options": {"include_usage": True}, "n": 2}),
], ids=["completion", "completion-streamed", "chat", "chat-streamed-n"])
def test_the_answer_is_rendered_by_one_call_that_goes_down(recorded_replica, path, body):
    runtime, recorder = recorded_replica
    recorder.recording = True
    reply = httpx.post(runtime.http.url + path, json=body, timeout=60)
    recorder.recording = False
    assert reply.status_code == 200, reply.text
    shaping = [(file, name) for file, name in recorder.from_serve.values() if file in ANSWER_SHAPING
               or (file == "replica/server/chat_answer.py" and name in ("message", "streams", "delta"))]
    assert shaping == [(RENDERER, "respond")]
    assert any("replica/server/output_usage.py" in w for w in recorder.answer_walks)  # the renderer went down
    assert {w: reentered(list(w)) for w in recorder.answer_walks if reentered(list(w))} == {}
