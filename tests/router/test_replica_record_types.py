"""The replica record is typed: no field of ``Replica`` is ``Any``, and its state, role and degraded causes are
enums whose wire forms (JSON, msgspec, f-strings, ``str()``) are the strings they were."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
from kvmesh.router.config import ReplicaSpec
from kvmesh.router.control.rows import replica_row
from kvmesh.router.replicas.replica import (
    DEGRADED_CAUSES,
    READY,
    DegradedCause,
    Replica,
    ReplicaState,
)
from kvmesh.router.replicas.roles import PREFILL, ROLES, ReplicaRole, check_role
from kvmesh.router.routing.kv_router import KVRouter


def test_no_field_of_the_replica_record_is_any():
    untyped = {f.name: f.type for f in dataclasses.fields(Replica) if "Any" in str(f.type) or f.type in ("", None)}
    assert untyped == {}


@pytest.mark.parametrize("member, wire", [(ReplicaState.READY, "ready"), (ReplicaState.DRAINING, "draining"),
                                          (ReplicaRole.PREFILL, "prefill"), (ReplicaRole.BOTH, "both"),
                                          (DegradedCause.LOST_EVENTS, "lost_events")])
def test_an_enum_member_reads_and_writes_as_its_string(member, wire):
    assert member == wire and hash(member) == hash(wire)
    assert (str(member), f"{member}", f"{member:>{len(wire)}}") == (wire, wire, wire)
    assert json.dumps({member: member}) == json.dumps({wire: wire})
    assert msgspec.json.encode([member]) == msgspec.json.encode([wire])


def test_roles_are_checked_into_the_enum_with_the_field_named():
    assert check_role("prefill") is ReplicaRole.PREFILL and check_role(PREFILL) is PREFILL
    assert ROLES == ("prefill", "decode", "both")
    with pytest.raises(ValueError, match=r"replica 'x' role='sideways' is not a replica role; choose one of "
                                         r"prefill, decode, both"):
        check_role("sideways", "replica 'x' role")
    with pytest.raises(ValueError, match="is not a replica role"):
        check_role(["prefill"])
    assert ReplicaSpec.parse("http://127.0.0.1:1,role=decode").role is ReplicaRole.DECODE


def test_the_router_keeps_enums_and_its_rows_keep_their_json():
    router = KVRouter(block_size=16)
    spec = ReplicaSpec("http://127.0.0.1:9", role="prefill")
    replica = router.add_replica(spec.replica_id, healthy=True, role=spec.role, spec=spec)
    assert (replica.role, replica.state) == (ReplicaRole.PREFILL, READY) and replica.prefill_only
    assert isinstance(replica.role, ReplicaRole) and isinstance(replica.state, ReplicaState)
    router.set_degraded(replica, "its block size is 32 tokens", DegradedCause.INCOMPATIBLE)
    row = msgspec.json.decode(msgspec.json.encode(replica_row(replica, now=0.0)))
    assert (row["role"], row["draining"], row["degraded"]) == ("prefill", False, "its block size is 32 tokens")
    assert json.dumps(replica.degraded) == '{"incompatible": "its block size is 32 tokens"}'
    with pytest.raises(ValueError, match="unknown degraded cause 'sideways'"):
        router.set_degraded(replica, "why", "sideways")  # a string from outside
    assert set(DEGRADED_CAUSES) == set(DegradedCause)
