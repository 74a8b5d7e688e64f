"""Where one replica listens: the ``--replica URL[,events=...,replay=...,name=...,role=...]`` spec."""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.router.replicas.roles import BOTH, ROLES, check_role


@dataclass(slots=True)
class ReplicaSpec:
    """Where one replica listens: its HTTP base URL and, optionally, its KV event endpoints."""

    url: str
    """HTTP base URL, e.g. ``http://127.0.0.1:8100`` (no trailing ``/v1``)."""
    events: str | None = None
    """ZeroMQ PUB endpoint of its KV events, e.g. ``tcp://127.0.0.1:5557``; None = no cache awareness."""
    replay: str | None = None
    """ZeroMQ replay/snapshot endpoint, e.g. ``tcp://127.0.0.1:5558``; None = no gap recovery."""
    replica_id: str = ""
    """Name used in metrics and the index; defaults to the URL."""
    role: str = BOTH
    """``prefill`` (computes prompts for decode replicas, never decodes), ``decode`` or ``both`` (the default)."""

    def __post_init__(self) -> None:
        self.role = check_role(self.role, f"replica {self.url!r} role")
        self.url = self.url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"replica URL {self.url!r} must start with http:// or https://")
        for name in ("events", "replay"):
            value = getattr(self, name)
            if value is not None and "://" not in value:
                raise ValueError(f"replica {name} endpoint {value!r} must look like tcp://HOST:PORT")
        if not self.replica_id:
            self.replica_id = self.url

    @classmethod
    def parse(cls, text: str) -> ReplicaSpec:
        """``URL[,events=tcp://H:P][,replay=tcp://H:P][,name=ID][,role=prefill|decode|both]`` -> ReplicaSpec."""
        url, *options = [part.strip() for part in text.split(",")]
        kwargs: dict[str, str] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("events", "replay", "name", "role"):
                raise ValueError(f"bad replica option {option!r} in {text!r}; use URL[,events=tcp://HOST:PORT]"
                                 f"[,replay=tcp://HOST:PORT][,name=ID][,role={'|'.join(ROLES)}]")
            kwargs["replica_id" if key == "name" else key] = value
        return cls(url=url, **kwargs)
