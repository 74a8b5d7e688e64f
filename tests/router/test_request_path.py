"""Following one completion request from the router's socket to its upstream call, no file is entered twice.

While the router answers a request, every call into kvmesh code records the chain of kvmesh files on
the stack (the door's connection at the bottom); at the moment the request goes upstream the chain is
recorded too. In no chain does a file come back after another one was entered (A -> B -> A).
"""

from __future__ import annotations

import sys
import threading

import httpx
import pytest
from kvmesh.router.http.upstream import UpstreamPool


def kvmesh_chain(frame) -> list[str]:
    """The kvmesh files on the stack from the door's connection up to ``frame``, adjacent repeats merged
    (empty when no request is being answered: the frames under the connection run the event loop)."""
    files = []
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("kvmesh."):
            code_file = frame.f_code.co_filename  # generated code (a dataclass's __init__) is its module's
            files.append(frame.f_globals.get("__file__", code_file) if code_file.startswith("<") else code_file)
        frame = frame.f_back
    files = merged(files[::-1])
    door = next((i for i, f in enumerate(files) if f.endswith("/http/connection.py")), None)
    return [] if door is None else files[door:]


def merged(files: list[str]) -> list[str]:
    """``files`` with adjacent repeats merged (a file calling into itself is not entering it again)."""
    return [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]


def reentered(chain: list[str]) -> list[str]:
    """Files that come back in ``chain`` after another file was entered."""
    return sorted({f for i, f in enumerate(chain) if f in chain[:i]})


def test_the_check_sees_a_file_entered_twice():
    """The check itself can fail: the proxy calling the relay calling the proxy back is caught."""
    chain = merged(["door.py", "proxy.py", "proxy.py", "relay.py", "proxy.py", "upstream.py"])
    assert reentered(chain) == ["proxy.py"]
    assert reentered(merged(["door.py", "proxy.py", "proxy.py", "upstream.py"])) == []


@pytest.fixture
def traced(monkeypatch):
    """Chains of kvmesh files seen in the router's threads while a request is answered, and at its upstream call."""
    seen = {"calls": [], "sends": [], "sent": False}
    post = UpstreamPool.post

    async def recording_post(self, *args, **kwargs):
        seen["sends"].append(kvmesh_chain(sys._getframe(1)))
        seen["sent"] = True
        return await post(self, *args, **kwargs)

    def profile(frame, event, arg):
        if event == "call" and not seen["sent"] and frame.f_globals.get("__name__", "").startswith("kvmesh."):
            chain = kvmesh_chain(frame)
            if chain:  # inside the door, answering a request
                seen["calls"].append(chain)

    monkeypatch.setattr(UpstreamPool, "post", recording_post)
    threading.setprofile(profile)  # the router's threads start after this
    try:
        yield seen
    finally:
        threading.setprofile(None)


TEXT = "Once upon a time there was a little dog " * 3


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": TEXT}),
                                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}]})])
@pytest.mark.parametrize("stream", [False, True])
def test_no_file_is_entered_twice_from_the_socket_to_the_upstream_call(fakes, start_router, traced, path, body,
                                                                      stream):
    router = start_router([f.spec for f in fakes])
    r = httpx.post(router.url + path, json={**body, "max_tokens": 4, "stream": stream}, timeout=30)
    assert r.status_code == 200, r.text
    (send,) = traced["sends"]
    names = [path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1] for path in send]
    assert names[0] == "http/connection.py" and names[-1] == "http/proxy.py", names  # socket -> ... -> upstream
    assert reentered(send) == [], names
    assert len(traced["calls"]) > 10  # the walk was seen call by call
    bad = [[p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p in c] for c in traced["calls"] if reentered(c)]
    assert bad == [], "\n".join(" -> ".join(c) for c in bad)
