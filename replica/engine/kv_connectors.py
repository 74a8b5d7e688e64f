"""The engine's KV connectors as one: each call of the seam (kv_connector.py) made on every connector, in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.replica.engine.kv_connector import KVConnector
    from kvmesh.replica.engine.request import Request

C = TypeVar("C")


class KVConnectors:
    """The connectors of one engine (the host tier's first, then the KV transfers); only the engine thread calls."""

    def __init__(self, connectors: list[KVConnector]) -> None:
        self.connectors = connectors
        """Called in this order at every point of the seam."""

    def __iter__(self):
        return iter(self.connectors)

    def get(self, kind: type[C]) -> C | None:
        """The connector of class ``kind`` (None without one)."""
        return next((c for c in self.connectors if isinstance(c, kind)), None)

    def update_connector_output(self) -> None:
        for connector in self.connectors:
            connector.update_connector_output()

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """The first connector's answer that loads anything (or is not known yet); (0, False) when none does."""
        for connector in self.connectors:
            tokens, load_async = connector.get_num_new_matched_tokens(request, num_computed_tokens)
            if tokens != 0:
                return tokens, load_async
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: list[KVCacheBlock], num_external_tokens: int) -> None:
        for connector in self.connectors:
            connector.update_state_after_alloc(request, blocks, num_external_tokens)

    def get_finished(self) -> set[str]:
        finished: set[str] = set()
        for connector in self.connectors:
            finished |= connector.get_finished()
        return finished

    def request_finished(self, request: Request) -> dict | None:
        """Before ``request``'s blocks are freed (a lease taken here holds them); the handle of its
        final output (the first connector's that gives any)."""
        params = None
        for connector in self.connectors:
            given = connector.request_finished(request)
            params = given if params is None else params
        return params

    def held_blocks(self) -> list[KVCacheBlock]:
        held: list[KVCacheBlock] = []
        for connector in self.connectors:
            held += connector.held_blocks()
        return held

    def between_steps(self) -> None:
        for connector in self.connectors:
            connector.between_steps()

    def idle_timeout(self) -> float | None:
        """The soonest any connector wants the engine thread back while idle (None: none waits)."""
        waits = [w for c in self.connectors if (w := c.idle_timeout()) is not None]
        return min(waits) if waits else None

    def load_fields(self) -> dict:
        """Every connector's fields of ``/load``."""
        fields: dict = {}
        for connector in self.connectors:
            fields.update(connector.load_fields())
        return fields

    def shutdown(self) -> None:
        for connector in self.connectors:
            connector.shutdown()
