"""ReplicaOptions, the server section and the TP rendezvous settings validate at the edge, with messages that say what
to do."""

from __future__ import annotations

import pytest
from kvmesh.replica.actor import ReplicaOptions
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.distributed.utils import DistributedInit, backend_for
from kvmesh.replica.server.config import ReplicaServerConfig

ENGINE = EngineConfig(model="some/model")


def test_options_default_to_ephemeral_ports():
    server = ReplicaOptions(engine=ENGINE).server
    assert (server.port, server.event_port, server.replay_port) == (0, 0, 0) and server.host == "auto"


@pytest.mark.parametrize("field", ["port", "event_port", "replay_port"])
def test_bad_port_is_refused(field):
    with pytest.raises(ValueError, match=field):
        ReplicaServerConfig(**{field: 70000})


def test_api_key_is_not_in_repr():
    server = ReplicaServerConfig(api_key="hunter2-secret")
    assert "hunter2" not in repr(ReplicaOptions(engine=ENGINE, server=server)) and "hunter2" not in repr(server)


def test_distributed_backend_follows_device():
    assert backend_for("cuda:0") == "nccl" and backend_for("cpu") == "gloo"
    with pytest.raises(ValueError, match="backend"):
        DistributedInit("127.0.0.1", 1234, 2, backend="mpi")
