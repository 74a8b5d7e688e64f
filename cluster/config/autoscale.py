"""``kvmesh serve``'s ``autoscale`` section: the bounds and targets of the autoscaling policy
(cluster/fleet/autoscaler.py), which the fleet runs against a live cluster and the simulator against its clock."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """Replicas that follow the traffic (``kvmesh serve``; off by default)."""

    scale_with_load: bool = False
    """Scale the replica count between min_replicas and max_replicas with the load."""
    min_replicas: int = 1
    """Fewest replicas the autoscaler keeps."""
    max_replicas: int = 4
    """Most replicas the autoscaler starts (and the embedded Ray instance is sized for)."""
    target_in_flight: float = 4.0
    """Requests in flight per replica the autoscaler aims for (the router's own count, with those every router's
    admission holds)."""
    target_queued_prefill_tokens: int = 0
    """Queued prefill tokens per replica it aims for (the replicas' /load); 0 = not used."""
    upscale_delay_s: float = 5.0
    """How long more replicas must be wanted before they are started."""
    downscale_delay_s: float = 30.0
    """How long fewer replicas must be enough before one is drained."""
    decision_interval_s: float = 1.0
    """How often the autoscaler reads the router's load."""
    drain_timeout_s: float = 300.0
    """Longest a drained replica may take to finish its requests before it is removed anyway."""

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(self.min_replicas >= 1, f"autoscale.min_replicas={self.min_replicas} must be at least 1")
        check(self.max_replicas >= self.min_replicas,
              f"autoscale.max_replicas={self.max_replicas} is below autoscale.min_replicas={self.min_replicas}")
        check(self.target_in_flight > 0, f"autoscale.target_in_flight={self.target_in_flight} must be > 0")
        check(self.target_queued_prefill_tokens >= 0,
              f"autoscale.target_queued_prefill_tokens={self.target_queued_prefill_tokens} must be >= 0")
        for name, value in (("upscale_delay_s", self.upscale_delay_s), ("downscale_delay_s", self.downscale_delay_s),
                            ("drain_timeout_s", self.drain_timeout_s)):
            check(value >= 0, f"autoscale.{name}={value} must be >= 0")
        check(self.decision_interval_s > 0, f"autoscale.decision_interval_s={self.decision_interval_s} must be > 0")

