"""The noisy-neighbour attack in each endpoint's own shape: ``/v1/responses`` tools with hostile JSON schemas,
tool_choice, ``text.format``, input items and previous ids (responses_shapes.py), stored-response ids and headers
(stored_and_headers.py), and a seeded set of field combinations on every endpoint (field_combos.py).

On conftest.py's ``noisy_fleet`` (a router with two tenants' keys in front of two replica processes, shared with
test_noisy_neighbour_live.py). The scene: the light tenant stores two responses whose input, instructions and
metadata carry its marker, the noisy tenant two of its own; one of each is aged past the store's bound (its row's
last use set to long ago: what a day unused does). Then, as in test_noisy_neighbour_live.py, the light tenant's plain
completions are timed one after another while the noisy tenant sends plain requests (the control) and then every
shot from its own process (shot_attacker.py). Then:

- every shot got a 2xx, or a 4xx with an OpenAI-shaped error, within ``HANG_S``; never a 5xx; another tenant's id a
  404 like an id never stored, on every route; its own expired id a 404 that says so (shots.py's ``verdict``);
- no answer carried the light tenant's marker, and the light tenant still reads its response whole;
- the light tenant's p90 during the attack stayed within ``SLOWDOWN`` x its p90 under the control;
- the router never held a replica down or ejected it.

``KVMESH_NOISY_SEED`` draws other combinations; a failure names each shot (its seed and number for a combination):
``python tests/security/shot_attacker.py ... --match`` replays it.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .noisy_fleet import INTERNAL_KEY, KEYS, NoisyFleet, Reading
from .noisy_watch import LightTenant, Timing, p90
from .shots import verdict
from .stored_and_headers import Ids
from .test_noisy_neighbour_live import HANG_S, SLOWDOWN, WINDOW

SEED = int(os.environ.get("KVMESH_NOISY_SEED", "1"))
COMBOS = 15
"""Combinations per endpoint."""
CONTROL_S = 4.0
"""The control: the noisy tenant's plain requests, as many at a time as its shots (the light tenant's base p90)."""
ATTACK_S = 90.0
"""The most the shots may take together (about 30 s on a loaded 2-core machine)."""
pytestmark = [pytest.mark.live, pytest.mark.timeout(ATTACK_S + CONTROL_S + 480)]
"""The shots, the control and the fleet's start when no file before started it (two models loading: 1-4 minutes on a
loaded 2-core machine)."""
HERE = Path(__file__).parent


@dataclass
class Run:
    results: list[dict]
    light: LightTenant
    control: float
    start: float
    end: float
    before: Reading
    after: Reading
    marker: str
    kept: httpx.Response
    """The light tenant's own retrieval of its response after the attack."""


def _store(fleet: NoisyFleet, tenant: str, text: str) -> str:
    r = httpx.post(fleet.url + "/v1/responses", timeout=60, headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                   json={"input": text, "instructions": text, "metadata": {"who": text}, "max_output_tokens": 4})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def _scene(fleet: NoisyFleet, marker: str) -> Ids:
    """The module doc's stored responses, two aged past the store's bound."""
    ids = Ids(_store(fleet, "light", marker), _store(fleet, "light", marker), _store(fleet, "noisy", "mine"),
              _store(fleet, "noisy", "mine"))
    with sqlite3.connect(fleet.responses_db, timeout=30) as db:
        db.execute("UPDATE kvmesh_responses SET used = 0 WHERE id IN (?, ?)", (ids.light_expired, ids.own_expired))
    db.close()
    return ids


WARM_UP = {"prompt": "A", "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
    "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#"}}}}}}
"""Sent to each replica itself: its grammar compile processes start on the first constrained request (seconds of a
loaded machine's CPU that would count against the first shots and the light tenant's base)."""


def _warm_up(fleet: NoisyFleet) -> None:
    def send(url: str) -> None:
        r = httpx.post(url + "/v1/completions", json=WARM_UP, timeout=120,
                       headers={"Authorization": f"Bearer {INTERNAL_KEY}"})
        assert r.status_code < 500, r.text

    with ThreadPoolExecutor(len(fleet.replicas)) as pool:
        list(pool.map(send, [replica.url for replica in fleet.replicas]))


def _run(*args: str, timeout: float) -> None:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def run(noisy_fleet, tmp_path_factory):
    fleet, marker, began = noisy_fleet, "light-marker-" + secrets.token_hex(8), time.monotonic()
    _warm_up(fleet)
    ids, out = _scene(fleet, marker), tmp_path_factory.mktemp("shots")
    light = LightTenant(fleet.url).start()
    try:
        before, control = fleet.read(), time.monotonic()
        _run(str(HERE / "noisy_attacker.py"), fleet.url, KEYS["noisy"], str(out / "control.jsonl"), "--plain-s",
             str(CONTROL_S), timeout=CONTROL_S + 60)
        start = time.monotonic()
        _run(str(HERE / "shot_attacker.py"), fleet.url, KEYS["noisy"], marker, json.dumps(ids.__dict__),
             str(out / "shots.jsonl"), "--seed", str(SEED), "--combos", str(COMBOS), "--timeout-s", str(HANG_S + 5),
             timeout=ATTACK_S)
        end = time.monotonic()
    finally:
        light.stop()
    kept = httpx.get(f"{fleet.url}/v1/responses/{ids.light}", timeout=30,
                     headers={"Authorization": f"Bearer {KEYS['light']}"})
    results = [json.loads(line) for line in (out / "shots.jsonl").read_text().splitlines()]
    print(f"warm-up and scene {control - began:.1f}s, control {start - control:.1f}s, {len(results)} shots "
          f"{end - start:.1f}s")  # shown for a test that passed too (pytest -rP)
    return Run(results, light, control, start, end, before, fleet.read(), marker, kept)


def test_every_shot_gets_a_clear_error_or_an_answer(run):
    from .shot_attacker import all_shots

    assert len(run.results) == len(all_shots(Ids("a", "b", "c", "d"), SEED, COMBOS))
    bad = [f"{r['name'][:200]}: {verdict(r, HANG_S)}: {r['status']} in {r['t1'] - r['t0']:.1f}s {r['head'][:160]!r}"
           for r in run.results if verdict(r, HANG_S)]
    assert not bad, f"{len(bad)} of {len(run.results)} shots (seed {SEED}):\n" + "\n".join(bad)


def test_no_shot_reads_or_removes_another_tenants_response(run):
    assert not [r["name"] for r in run.results if r["leak"]]
    assert run.kept.status_code == 200, run.kept.text
    assert run.kept.json()["metadata"] == {"who": run.marker}


def test_the_light_tenant_keeps_its_latency_during_the_attack(run):
    light = run.light
    failed = [t for t in light.timings if t.status != 200]
    assert not failed, f"the light tenant's requests failed: {failed[:10]}"
    base, during = p90(light.between(run.control + 1, run.start)), light.between(run.start, run.end)
    assert p90(during) <= SLOWDOWN * base, (
        f"the light tenant's p90 was {p90(during) * 1e3:.0f} ms during the attack, over {SLOWDOWN}x its p90 under "
        f"the control ({base * 1e3:.0f} ms); its slow windows and the shots in flight then:\n"
        + "\n".join(_slow_windows(run, during, SLOWDOWN * base)))


def _slow_windows(run: Run, timings: list[Timing], bound: float) -> list[str]:
    out = []
    for window in (timings[i:i + WINDOW] for i in range(0, len(timings), WINDOW)):
        if len(window) > 1 and (seen := p90(window)) > bound:
            t0, t1 = window[0].t0, window[-1].t1
            shots = [r["name"][:80] for r in run.results if r["t0"] < t1 and r["t1"] > t0]
            out.append(f"  p90 {seen * 1e3:.0f} ms over {t0 - run.start:.1f}-{t1 - run.start:.1f}s: {shots[:6]}")
    return out


def test_the_router_holds_every_replica_healthy_and_ejects_none(run):
    assert not run.after.unhealthy
    assert run.after.ejections == run.before.ejections
