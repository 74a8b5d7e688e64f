"""`kvmesh events tail` prints the stream for people and as JSON lines for tools."""

import json
import time

import pytest
from events_testkit import make_publisher, stored
from kvmesh.cluster.cli import main
from kvmesh.cluster.commands import events as events_command
from kvmesh.events.schema import BlockRemoved


def test_tail_prints_one_human_line_per_event(capsys):
    with make_publisher() as pub:
        pub.publish([stored(0xABC, None), stored(0xDEF, 0xABC)])
        pub.publish([BlockRemoved(block_hashes=[0xDEF], medium="CPU")])
        assert main(["events", "tail", "--endpoint", f"r7={pub.endpoint}", "--replay-endpoint",
                     pub.replay_endpoint, "--count", "2", "--duration", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # the tail starts from a snapshot: the clear, then the cached chain
    assert lines[0].split()[:3] == ["r7", "seq=1", "AllBlocksCleared"]
    assert lines[1].split() == ["r7", "seq=1", "BlockStored", "blocks=1", "first=0000000000000abc", "parent=-"]


def test_tail_json_lines_carry_every_field(capsys):
    with make_publisher() as pub:
        pub.publish([stored(5, 4)])
        assert main(["events", "tail", "--endpoint", pub.endpoint, "--replay-endpoint", pub.replay_endpoint,
                     "--json", "--count", "2", "--duration", "5"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["type"] == "AllBlocksCleared" and rows[0]["replica"] == "replica-0"
    assert rows[1]["type"] == "BlockStored" and rows[1]["block_hashes"] == [5]
    assert rows[1]["parent_block_hash"] == 4 and rows[1]["seq"] == 0


def test_tail_without_events_ends_after_its_duration(capsys):
    with make_publisher() as pub:
        assert main(["events", "tail", "--endpoint", pub.endpoint, "--duration", "0.2"]) == 0
    assert "batches=0" in capsys.readouterr().err


def test_tail_of_a_private_stream_says_why_nothing_arrives(capsys):
    import zmq
    from kvmesh.events import curve

    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    _, secret = curve.generate_keypair()
    with make_publisher(curve_secret_key=secret) as pub:  # what `kvmesh serve` runs by default
        pub.publish([stored(5, 4)])
        assert main(["events", "tail", "--endpoint", pub.endpoint, "--no-snapshot", "--duration", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "batches=0" in err and "private by default" in err and "--no-private-events" in err


def test_tail_of_a_private_stream_blames_the_key_first_and_counts_no_bad_frame(capsys, monkeypatch):
    import zmq
    from kvmesh.events import curve

    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    _, secret = curve.generate_keypair()
    err = []

    def until_refused(done, duration):
        """The tail's wait, ended once it printed its refusal: a loaded machine gets up to 30 s, an idle one needs
        well under one."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("refused" in e for e in err):
            done.wait(0.1)
            err.append(capsys.readouterr().err)
        time.sleep(1)  # a refused handshake is retried every 0.3 s meanwhile: none may count as a reconnection

    monkeypatch.setattr(events_command, "_wait", until_refused)
    with make_publisher(curve_secret_key=secret) as pub:
        pub.publish([stored(5, 4)])
        assert main(["events", "tail", "--endpoint", pub.endpoint, "--replay-endpoint", pub.replay_endpoint,
                     "--duration", "5"]) == 0
    err.append(capsys.readouterr().err)
    lines = [line for line in "".join(err).splitlines() if line.startswith("#")]
    assert "refused our handshake: its stream is private (CURVE)" in lines[0], lines
    assert "--no-private-events" in lines[0], lines
    totals = dict(item.split("=") for item in lines[-1][2:].split())
    assert totals["bad_frames"] == totals["reconnects"] == "0", lines[-1]
