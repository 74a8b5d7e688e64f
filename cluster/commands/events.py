"""``kvmesh events tail``: print the KV event streams of one or more replicas.

    kvmesh events tail --endpoint tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558
    kvmesh events tail --endpoint r0=tcp://127.0.0.1:5557 --endpoint r1=tcp://127.0.0.1:5559 --json

The ports above are replica 0's and 1's under ``kvmesh serve``'s defaults (replicas.event_port
5557: replica i publishes on 5557+2i, replay on 5558+2i); ``kvmesh status`` and the serve log
print each replica's actual addresses.

People get one line per event (replica, seq, type, #blocks, first hash, parent); ``--json`` gives
one JSON object per event for tools. With a replay endpoint, gaps are repaired and the tail
starts from a snapshot of the replica's current cache (``--no-snapshot`` to skip it). Works
against kvmesh replicas and plain vLLM servers alike. Ctrl-C exits cleanly with a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

PRIVATE_HINT = ("a `kvmesh serve` cluster's event streams are private by default (CURVE: only its own router "
                "can read them); restart it with --no-private-events to tail them")
NO_ANSWER_HINT = (
    f"{PRIVATE_HINT}. Otherwise check the addresses: replica i of serve "
    "publishes on 5557+2i and answers replays on 5558+2i (`kvmesh status` lists them)")
"""What a silent stream most likely means, and what to do."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("events", help="inspect KV event streams",
                                   description="Inspect the KV event streams of replicas.")
    sub = parser.add_subparsers(dest="events_command", metavar="ACTION")
    tail = sub.add_parser("tail", help="print events as they arrive", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    tail.add_argument("--endpoint", action="append", required=True, metavar="[NAME=]ADDRESS",
                      help="a replica's PUB address (repeat for several); bind://tcp://HOST:PORT "
                           "listens for publishers that connect instead")
    tail.add_argument("--replay-endpoint", action="append", default=[], metavar="ADDRESS",
                      help="the replay/snapshot address of each --endpoint, in the same order")
    tail.add_argument("--topic", default="", help="topic prefix to subscribe to (default: '', every topic)")
    tail.add_argument("--json", action="store_true", help="one JSON object per event")
    tail.add_argument("--no-snapshot", action="store_true", help="do not start from a snapshot")
    tail.add_argument("--count", type=int, default=None, help="exit after this many events")
    tail.add_argument("--duration", type=float, default=None, help="exit after this many seconds")
    tail.set_defaults(func=run)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _sources(args):
    from kvmesh.events.config import PublisherSource

    if len(args.replay_endpoint) > len(args.endpoint):
        raise ValueError("more --replay-endpoint than --endpoint values")
    sources = []
    for i, spec in enumerate(args.endpoint):
        name, _, address = spec.partition("=") if "=" in spec.split("://", 1)[0] else ("", "", spec)
        replay = args.replay_endpoint[i] if i < len(args.replay_endpoint) else None
        sources.append(PublisherSource(name or f"replica-{i}", address, replay, topic=args.topic))
    return sources


def _hex(h) -> str:
    return "-" if h is None else f"{h:016x}" if isinstance(h, int) else str(h)


def format_event(name: str, seq: int, event) -> str:
    """The human line for one event."""
    from kvmesh.events.schema import BlockRemoved, BlockStored

    kind = type(event).__name__
    hashes = event.block_hashes if isinstance(event, BlockStored | BlockRemoved) else []
    line = f"{name:<12} seq={seq:<8} {kind:<16} blocks={len(hashes):<4}"
    if hashes:
        line += f" first={_hex(hashes[0])}"
    if kind == "BlockStored":
        line += f" parent={_hex(event.parent_block_hash)}"
        if event.lora_name is not None:
            line += f" lora={event.lora_name}"
    return line


def event_json(name: str, seq: int, ts: float, event) -> str:
    """The JSON line for one event: replica, seq, ts, then the event's own fields (with "type")."""
    import msgspec

    return json.dumps({"replica": name, "seq": seq, "ts": ts, **msgspec.to_builtins(event)})


def run(args) -> int:
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.events.subscribe.health import REFUSED
    from kvmesh.events.subscribe.subscriber import EventSubscriber

    done = threading.Event()
    printed = [0]
    out = sys.stdout

    def on_batch(name, seq, batch) -> None:
        if done.is_set():
            return
        try:
            for event in batch.events:
                out.write((event_json(name, seq, batch.ts, event) if args.json
                           else format_event(name, seq, event)) + "\n")
                printed[0] += 1
                if args.count is not None and printed[0] >= args.count:
                    done.set()
                    break
            out.flush()
        except BrokenPipeError:  # `| head`: the reader left
            done.set()

    hinted = []

    def on_status(name, status, detail) -> None:
        if status == REFUSED:  # said first, before a snapshot times out
            if name not in hinted:
                hinted.append(name)
                print(f"# {name}: {detail}: {PRIVATE_HINT}", file=sys.stderr, flush=True)
            return
        print(f"# {name}: {status}: {detail}", file=sys.stderr, flush=True)
        if status in ("snapshot_failed", "unrecovered") and "answer" in detail and not hinted:
            hinted.append(name)
            print(f"# {name} did not answer: {NO_ANSWER_HINT}", file=sys.stderr, flush=True)

    config = SubscriberConfig(snapshot_on_start=not args.no_snapshot)
    try:
        subscriber = EventSubscriber(_sources(args), on_batch=on_batch, config=config, on_status=on_status)
        subscriber.start()
    except (ValueError, OSError) as e:  # a malformed or unusable address
        print(f"kvmesh events tail: {e} (e.g. --endpoint tcp://127.0.0.1:5557)", file=sys.stderr)
        return 2
    try:
        _wait(done, args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        subscriber.close()
        totals = subscriber.totals()
        print("# " + " ".join(f"{k}={v}" for k, v in totals.items()), file=sys.stderr, flush=True)
        if not totals.get("batches") and not hinted:
            print(f"# nothing arrived (an idle replica sends nothing; a busy one whose stream you cannot read "
                  f"neither): {NO_ANSWER_HINT}", file=sys.stderr, flush=True)
    return 0


def _wait(done: threading.Event, duration: float | None) -> None:
    """Until ``done`` is set, or ``duration`` seconds passed (None: no end)."""
    if duration is not None:
        done.wait(duration)
        return
    while not done.wait(0.5):  # short waits keep Ctrl-C responsive
        pass
