"""Prefill and decode replicas in `kvmesh serve`: the settings and their errors, which replicas get
which role and name, when the KV transfer is on, and what the fleet allows per role -- checked on the real
config loader, CLI and ``Fleet`` without Ray (the fleet's cluster is a stand-in holding what it reads)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from kvmesh.cluster.config.loader import ConfigError, from_dict, load
from kvmesh.cluster.config.roles import kv_transfer_on, replica_name, serving_role
from kvmesh.cluster.config.trees import SERVE_SCHEMA
from kvmesh.cluster.fleet.operations import Fleet
from kvmesh.cluster.launch.ray_cluster import DRIVER_CPUS, embedded_num_cpus
from kvmesh.cluster.launch.replica_sections import replica_kv_transfer
from kvmesh.cluster.launch.serve_state import ServeState
from kvmesh.cluster.launch.supervisor import ReplicaHandle, replica_index
from prometheus_client import CollectorRegistry


def test_prefill_replicas_are_a_yaml_key_a_variable_and_a_flag():
    assert from_dict({}).replicas.num_prefill_replicas == 0  # no split unless asked
    assert from_dict({"replicas": {"num_prefill_replicas": 2}}).replicas.num_prefill_replicas == 2
    env = {"KVMESH_REPLICAS_NUM_PREFILL_REPLICAS": "1", "KVMESH_REPLICAS_KV_TRANSFER": "on"}
    config = load(SERVE_SCHEMA, env=env)
    assert (config.replicas.num_prefill_replicas, config.replicas.kv_transfer) == (1, "on")
    flags = {opt.flag for opt in SERVE_SCHEMA.options}
    assert {"--num-prefill-replicas", "--kv-transfer"} <= flags


@pytest.mark.parametrize(("data", "message"), [
    ({"num_prefill_replicas": -1}, r"replicas\.num_prefill_replicas=-1 must be 0 \(no split\) or more"),
    ({"num_prefill_replicas": "one"}, r"replicas\.num_prefill_replicas \(--num-prefill-replicas or "
                                      r"KVMESH_REPLICAS_NUM_PREFILL_REPLICAS\): expected `int`"),
    ({"kv_transfer": "yes"}, r"replicas\.kv_transfer='yes'; expected one of auto, on, off"),
    ({"num_prefill_replicas": 1, "kv_transfer": "off"}, r"num_prefill_replicas=1 needs the KV transfer .* "
                                                        r"replicas\.kv_transfer=off"),
    ({"num_prefil_replicas": 1}, r"did you mean 'num_prefill_replicas'"),
])
def test_bad_role_settings_are_clear_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"replicas": data})


def _kvmesh(*argv: str) -> subprocess.CompletedProcess:
    code = "import sys; from kvmesh.cluster.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)


def test_a_negative_prefill_count_on_the_command_line_is_one_line_and_exit_2():
    result = _kvmesh("serve", "--num-prefill-replicas", "-1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "num_prefill_replicas=-1 must be 0 (no split) or more" in result.stderr


def test_a_mistyped_role_flag_gets_a_suggestion():
    result = _kvmesh("serve", "--num-prefil-replicas", "1")
    assert result.returncode == 2 and "did you mean --num-prefill-replicas?" in result.stderr, result.stderr
    scale = _kvmesh("scale", "--role", "prefil", "2")
    assert scale.returncode == 2 and "did you mean 'prefill'?" in scale.stderr, scale.stderr


def test_the_serving_replicas_decode_next_to_prefill_replicas_and_do_both_without():
    assert serving_role(0) == "both" and serving_role(1) == "decode"
    assert replica_name(3, "prefill") == "prefill-3" and replica_name(0, "decode") == "replica-0"
    assert replica_index("prefill-3") == 3  # one index space: ports and placement groups by index


def test_kv_transfer_is_on_with_prefill_replicas_or_when_asked():
    assert kv_transfer_on("auto", 1)  # prefill replicas need it
    assert not kv_transfer_on("auto", 0)  # no NIXL agent (a busy-polling core per replica) unless asked
    assert not kv_transfer_on("off", 0) and kv_transfer_on("on", 0)


def test_the_embedded_ray_and_the_ports_count_the_prefill_replicas():
    config = from_dict({"replicas": {"num_replicas": 2, "num_prefill_replicas": 2}})
    assert config.replicas.num_started == 4 and config.max_replica_slots == 5  # + one a rollout adds
    assert embedded_num_cpus(config) == 5 + DRIVER_CPUS
    with pytest.raises(ConfigError, match="router.port and replicas.http_port both use port 8104"):
        from_dict({"replicas": {"num_replicas": 2, "num_prefill_replicas": 2}, "router": {"port": 8104}})


def _fleet(*replicas: tuple[str, str], **config) -> Fleet:
    state = ServeState(replicas=[ReplicaHandle(replica_id=rid, actor=None, role=role) for rid, role in replicas])
    state.router = SimpleNamespace(runtime=SimpleNamespace(metrics=SimpleNamespace(registry=CollectorRegistry())))
    prefill = sum(role == "prefill" for _, role in replicas)
    cfg = from_dict({"replicas": {"num_replicas": len(replicas) - prefill, "num_prefill_replicas": prefill,
                                  **config}, "ray": {"wait_for_nodes": True}})  # wait_for_nodes: no Ray asked
    state.kv_transfer = replica_kv_transfer(cfg)
    return Fleet(SimpleNamespace(config=cfg, state=state, report=lambda message: None))


def test_draining_the_last_decode_replica_is_refused_while_prefill_replicas_remain():
    fleet = _fleet(("replica-0", "decode"), ("prefill-1", "prefill"))
    with pytest.raises(ValueError, match="replica-0 is this cluster's last replica that decodes.*kvmesh scale 2"):
        fleet.request_remove("replica-0")
    assert fleet.state()["queued"] == 0 and fleet.target == 1


def test_a_prefill_replica_drains_even_the_last_one_and_lowers_the_prefill_target():
    fleet = _fleet(("replica-0", "decode"), ("prefill-1", "prefill"))
    assert fleet.request_remove("prefill-1")
    state = fleet.state()
    assert (state["target"], state["prefill_target"], state["queued"]) == (1, 0, 1)
    assert state["roles"] == {"replica-0": "decode", "prefill-1": "prefill"}


def test_scale_per_role_queues_that_roles_operation_and_checks_its_bounds():
    fleet = _fleet(("replica-0", "decode"), ("prefill-1", "prefill"))
    answer = fleet.request_scale(2, "prefill")
    assert answer["operation"] == "scale to 2 prefill" and answer["role"] == "prefill"
    assert fleet.request_scale(0, "prefill")["accepted"]  # no prefill replica: the decode ones compute prompts
    assert fleet.request_scale(3, "decode")["operation"] == "scale to 3"
    with pytest.raises(ValueError, match="cannot scale to 0 replicas: allowed 1.."):
        fleet.request_scale(0)
    with pytest.raises(ValueError, match="role='prefil' is not a replica role; choose one of prefill, decode, both"):
        fleet.request_scale(1, "prefil")
    assert fleet.state()["queued"] == 3


def test_prefill_replicas_are_refused_where_the_kv_transfer_is_off():
    fleet = _fleet(("replica-0", "both"), kv_transfer="off")
    with pytest.raises(ValueError, match="run without KV transfer \\(replicas.kv_transfer=off"):
        fleet.request_scale(1, "prefill")


def test_the_autoscaler_sees_only_the_replicas_that_decode():
    fleet = _fleet(("replica-0", "decode"), ("replica-1", "decode"), ("prefill-2", "prefill"))
    assert fleet.serving_ids() == ["replica-0", "replica-1"] and fleet.target == 2 and fleet.prefill_target == 1


def test_a_new_replica_of_either_role_takes_a_fresh_index():
    fleet = _fleet(("replica-0", "decode"), ("prefill-1", "prefill"))
    assert fleet.new_indexes(1) == [2] and fleet.new_indexes(1) == [3]


def _without_ray(monkeypatch, fleet: Fleet) -> list[str]:
    """Replace the fleet's two Ray steps by their effect on the replica set (what they do to Ray is tested live);
    returns the log of what was started and removed."""
    from kvmesh.cluster.fleet import operations

    log: list[str] = []

    def add(cluster, indexes, role):
        handles = [ReplicaHandle(replica_id=replica_name(i, role), actor=None, role=role) for i in indexes]
        cluster.state.replicas.extend(handles)
        log.extend(f"+{h.replica_id}:{role}" for h in handles)
        return handles

    def remove(cluster, handle, drain_timeout_s):
        cluster.state.replicas.remove(handle)
        log.append(f"-{handle.replica_id}")

    monkeypatch.setattr(operations, "add_replicas", add)
    monkeypatch.setattr(operations, "remove_replica", remove)
    fleet.st.router_client = SimpleNamespace(replicas=lambda drain_cost: [
        {"id": h.replica_id, "exclusive_blocks": 0, "in_flight": 0} for h in fleet.st.replicas])
    return log


def test_a_rollout_replaces_each_replica_by_one_of_its_role(monkeypatch):
    fleet = _fleet(("replica-0", "decode"), ("prefill-1", "prefill"))
    log = _without_ray(monkeypatch, fleet)
    fleet.rollout(fleet.st.engine)
    assert log == ["+replica-2:decode", "-replica-0", "+prefill-3:prefill", "-prefill-1"]


def test_scaling_one_role_leaves_the_other_alone(monkeypatch):
    fleet = _fleet(("replica-0", "decode"), ("prefill-1", "prefill"), ("prefill-2", "prefill"))
    log = _without_ray(monkeypatch, fleet)
    fleet.scale_to(0, "prefill")
    fleet.scale_to(2, "decode")
    assert log == ["-prefill-1", "-prefill-2", "+replica-3:decode"]
    assert fleet.state()["roles"] == {"replica-0": "decode", "replica-3": "decode"}


def test_the_cli_counts_and_describes_per_role():
    from kvmesh.cluster.commands import drain, scale

    state = {"replicas": ["replica-0", "prefill-1", "prefill-2"],
             "roles": {"replica-0": "decode", "prefill-1": "prefill", "prefill-2": "prefill"}}
    assert scale.count(state, "prefill") == 2 and scale.count(state, None) == 1 and scale.count(state, "decode") == 1
    assert scale.describe(2, {"replicas": state["replicas"], "role": "prefill"}).startswith(
        "scaling to 2 prefill replica(s) (now 3 in all")
    said = drain.describe({"id": "prefill-2", "in_flight": 0, "will_be_removed": True, "target": 1})
    assert "kvmesh scale --role prefill N" in said and "target becomes" not in said


def test_serves_kv_transfer_section_reaches_every_replica_on_nixl_and_on_as_replicas_kv_transfer_says():
    on = replica_kv_transfer(from_dict({"replicas": {"kv_transfer": "on"}, "kv_transfer": {"lease_ttl_s": 5}}))
    assert (on.enabled, on.transport, on.lease_ttl_s) == (True, "nixl", 5)
    assert not replica_kv_transfer(from_dict({"replicas": {"kv_transfer": "off"}})).enabled
    assert replica_kv_transfer(from_dict({"replicas": {"num_prefill_replicas": 1}})).enabled
    with pytest.raises(ConfigError, match=r"kv_transfer\.enabled cannot be set .*replicas\.kv_transfer"):
        from_dict({"kv_transfer": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"kv_transfer\.transport cannot be set .*nixl"):
        from_dict({"kv_transfer": {"transport": "local"}})
