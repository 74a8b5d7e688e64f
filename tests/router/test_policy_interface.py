"""A routing policy is handed the candidate replicas themselves and answers with one (router/routing/candidates.py):
no id-keyed loads in its signature, no alias of a replica's id in policies/; a new policy is one file and one line of
the registry; ``KVRouter`` stays a class that reads at once (its parts: pull_planning.py, event_intake.py)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing import policies
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies.base import Policy
from kvmesh.router.routing.tier_matches import TierMatches

ROOT = Path(__file__).resolve().parents[2]
POLICIES_DIR = ROOT / "router/routing/policies"
MAX_KV_ROUTER_LINES = 200


def _trees():
    return [(p.name, ast.parse(p.read_text())) for p in sorted(POLICIES_DIR.glob("*.py"))]


def test_no_policy_names_a_replica_by_its_id_type_or_takes_a_loads_mapping():
    found = []
    for name, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in ("ReplicaId", "Loads"):
                found.append(f"{name}:{node.lineno} {node.id}")
            if isinstance(node, ast.alias) and node.name in ("ReplicaId", "Loads"):
                found.append(f"{name}:{node.lineno} imports {node.name}")
            if isinstance(node, ast.arg) and node.arg == "loads":
                found.append(f"{name}:{node.lineno} parameter loads")
    assert found == []


def test_the_kv_router_class_reads_at_once():
    tree = ast.parse((ROOT / "router/routing/kv_router.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVRouter")
    assert cls.end_lineno - cls.lineno + 1 < MAX_KV_ROUTER_LINES


class FewestRunning(Policy):
    """A new policy, as a user writes one: the candidate running the fewest requests."""

    name = "fewest_running"

    def choose(self, request_keys: Sequence[int], tiers: TierMatches, candidates: Candidates,
               num_prompt_tokens: int | None = None, lora_name: str | None = None) -> Replica:
        return min(candidates, key=lambda r: r.load.in_flight)


def test_a_new_policy_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(policies.POLICIES, "fewest_running", FewestRunning)  # its line in the registry
    from kvmesh.router.config import RouterConfig, build_router

    router = build_router(RouterConfig(policy="fewest_running"), seed=1)
    for rid in ("a", "b", "c"):
        router.add_replica(rid)
    router.loads.on_dispatch(router.replicas.get("a"), 10)
    router.loads.on_dispatch(router.replicas.get("c"), 10)
    decision = router.route(list(range(3, 40)))
    assert decision.replica is router.replicas.get("b") and decision.replica_id == "b"


class Stranger(Policy):
    """A hostile policy: it answers with a record it was not given."""

    name = "stranger"

    def choose(self, request_keys, tiers, candidates, num_prompt_tokens=None, lora_name=None):
        return Replica(candidates[0].id)  # the same id, another record


def test_a_policy_answering_with_a_record_it_was_not_given_is_refused():
    router = KVRouter(block_size=16, policy=Stranger())
    router.add_replica("a")
    with pytest.raises(TypeError, match="not one of its candidates"):
        router.route(list(range(3, 40)))


def test_candidates_answer_by_their_records():
    records = [Replica("a"), Replica("b")]
    among = Candidates.of(records)
    assert list(among) == records and among[1] is records[1] and len(among) == 2
    assert among.named("b") is records[1] and among.named("z") is None
    assert records[0] in among and Replica("a") not in among
    assert list(among.only(records[1], records[0])) == [records[1], records[0]]
