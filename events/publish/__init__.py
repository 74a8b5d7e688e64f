"""kvmesh.events.publish: a replica's side of the stream: ``publisher`` (ZmqEventPublisher) and ``publisher_io``
(its I/O thread: the PUB, the replay ring, the shadow, replay and snapshot answers). Imports only the top of
``events`` (schema, codec, wire, config, endpoints, curve, state, ratelimit), never ``subscribe``."""
