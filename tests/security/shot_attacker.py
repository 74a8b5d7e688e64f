"""The noisy tenant of the Responses attack: every shot (responses_shapes.py, stored_and_headers.py, field_combos.py)
sent to a router, ``--concurrency`` at a time, from its own process (building and sending megabytes takes nothing from
the process that times the light tenant).

    python tests/security/shot_attacker.py URL KEY MARKER IDS_JSON OUT.jsonl [--seed 1] [--combos 25]
                                           [--concurrency 4] [--timeout-s 25] [--match REGEX]

``IDS_JSON`` holds stored_and_headers.py's ``Ids``; ``MARKER`` is the light tenant's (an answer that carries it leaked
its data). Each answer is one JSON line of ``OUT`` (shots.py's ``send``). ``--match`` replays the shots whose name
matches, against any router.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the suite's own modules

from tests.security.field_combos import combos  # noqa: E402
from tests.security.responses_shapes import responses_shots  # noqa: E402
from tests.security.shots import Shot, send  # noqa: E402
from tests.security.stored_and_headers import Ids, header_shots, stored_shots  # noqa: E402


def all_shots(ids: Ids, seed: int, per_endpoint: int) -> list[Shot]:
    """Every shot, in its order: the Responses shapes, stored ids, headers, then the combinations."""
    return [*responses_shots(), *stored_shots(ids), *header_shots(ids), *combos(seed, per_endpoint)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("url", "key", "marker", "ids"):
        parser.add_argument(name)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--combos", type=int, default=25, help="combinations per endpoint")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=25.0, help="a request's bound")
    parser.add_argument("--match", help="only the shots whose name matches this regex")
    args = parser.parse_args()
    shots = [s for s in all_shots(Ids(**json.loads(args.ids)), args.seed, args.combos)
             if args.match is None or re.search(args.match, s.name)]
    lock, local = threading.Lock(), threading.local()

    def one(shot: Shot) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=args.url)
        result = send(local.client, shot, args.key, args.marker, args.timeout_s)
        with lock, args.out.open("a") as f:
            f.write(json.dumps(result) + "\n")

    with ThreadPoolExecutor(args.concurrency) as pool:
        for _ in pool.map(one, shots):
            pass


if __name__ == "__main__":
    main()
