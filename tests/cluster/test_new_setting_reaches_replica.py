"""A new engine, server or events setting is one dataclass field: it reaches the running replica from YAML,
the environment and a flag, with no other line written (each part takes its config section whole)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.commands import replica as replica_command
from kvmesh.cluster.config import trees as cluster_config
from kvmesh.cluster.config.schema import Schema
from kvmesh.cluster.config.trees import ReplicaCommandConfig
from kvmesh.events.config import PublisherConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.worker.fake_runner import FakeModelRunner


@dataclass(frozen=True, slots=True)
class EngineWithKnob(EngineConfig):
    """The engine section with one more field."""

    new_engine_knob: int = 1
    """A setting added by this test."""


@dataclass(frozen=True, slots=True)
class ServerWithKnob(ReplicaServerConfig):
    """The server section with one more field."""

    new_server_knob: str = "off"
    """A setting added by this test."""


@dataclass
class EventsWithKnob(PublisherConfig):
    """The events section with one more field."""

    new_events_knob: float = 0.5
    """A setting added by this test."""


@dataclass(frozen=True, slots=True)
class CommandWithKnobs(ReplicaCommandConfig):
    """``kvmesh replica``'s tree, its sections being the ones above."""

    engine: EngineWithKnob
    """The engine."""
    server: ServerWithKnob = field(default_factory=ServerWithKnob)
    """HTTP and event addresses."""
    events: EventsWithKnob = field(default_factory=EventsWithKnob)
    """The KV event stream."""


WANT = {"new_engine_knob": 7, "new_server_knob": "on", "new_events_knob": 2.5}
FREE_PORTS = ["--port", "0", "--event-port", "0", "--replay-port", "0"]


@pytest.fixture
def schema(monkeypatch):
    schema = Schema(CommandWithKnobs, hidden=cluster_config.REPLICA_SCHEMA.hidden)
    monkeypatch.setattr(replica_command, "REPLICA_SCHEMA", schema)
    return schema


def _sources(how: str, tmp_path, monkeypatch) -> list[str]:
    """The argv that sets the three new fields (through the file, the environment or flags)."""
    if how == "yaml":
        path = tmp_path / "replica.yaml"
        path.write_text("engine: {new_engine_knob: 7}\nserver: {new_server_knob: 'on'}\nevents: {new_events_knob: "
                        "2.5}\n")
        return ["--config", str(path)]
    if how == "env":
        monkeypatch.setenv("KVMESH_ENGINE_NEW_ENGINE_KNOB", "7")
        monkeypatch.setenv("KVMESH_SERVER_NEW_SERVER_KNOB", "on")
        monkeypatch.setenv("KVMESH_EVENTS_NEW_EVENTS_KNOB", "2.5")
        return []
    return ["--new-engine-knob", "7", "--new-server-knob", "on", "--new-events-knob", "2.5"]


@pytest.mark.parametrize("how", ["yaml", "env", "flag"])
def test_a_new_field_reaches_the_running_replicas_own_config(how, schema, stories_path, tmp_path, monkeypatch):
    argv = ["replica", "--model", str(stories_path), *FREE_PORTS, *_sources(how, tmp_path, monkeypatch)]
    config = replica_command.load(build_parser().parse_args(argv))
    runtime = replica_command.start(config, model_runner=FakeModelRunner(num_kv_blocks=64, vocab_size=512))
    try:
        engine, server, events = runtime.llm.engine.config, runtime.state.server, runtime.publisher.config
        got = {"new_engine_knob": engine.new_engine_knob, "new_server_knob": server.new_server_knob,
               "new_events_knob": events.new_events_knob}
        assert got == WANT
    finally:
        runtime.shutdown(graceful_s=0)


def test_the_new_fields_have_a_flag_a_variable_and_a_doc(schema):
    for dotted in ("engine.new_engine_knob", "server.new_server_knob", "events.new_events_knob"):
        option = schema.option(dotted)
        assert option is not None and option.doc == "A setting added by this test."
        assert option.flag == "--" + dotted.split(".")[1].replace("_", "-")
        assert option.envs[0] == "KVMESH_" + dotted.replace(".", "_").upper()
