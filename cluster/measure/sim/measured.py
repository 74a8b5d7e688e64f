"""What a simulated replica measures of itself and reports in ``/load``, as a real one does: its prefill
rate (replica/engine/prefill_rate.py) and decode step time by batch and context (replica/engine/step_time.py),
fitted on its own simulated steps, plus what its transfers and host tier would report. The router's cost model
(router/routing/cost/) prices a simulated replica from exactly these fields, so ``kvmesh sim`` runs the same cost
code as the HTTP router.

Bytes are counted as one per token (block bytes = block size): only the ratios matter, so the host tier's and the
pull's rates are in tokens per second too.

Until a router polls ``/load`` (``load_poll_s``; without polling it never does), a replica's rates are the cost
model's own constants (``sim_load_rates``): what its fit converges to.
"""

from __future__ import annotations

from kvmesh.cluster.measure.sim.config import SimConfig, cache_bytes_per_token
from kvmesh.replica.engine.prefill_rate import PrefillRate
from kvmesh.replica.engine.step_time import DecodeStepTime
from kvmesh.replica.serving.load_report import DecodeStepLoad, KVTransferLoad, LoadReport
from kvmesh.router.replicas.load import ReplicaLoad


class SimMeasures:
    """One simulated replica's measurements of its steps."""

    def __init__(self) -> None:
        self.prefill_rate = PrefillRate()
        self.decode_step_time = DecodeStepTime()

    def record(self, num_prefill: int, num_decodes: int, context_tokens: int, step_s: float, num_steps: int) -> None:
        """A step (or ``num_steps`` identical decode steps) of ``step_s`` seconds each."""
        if num_prefill:
            self.prefill_rate.record(num_prefill + num_decodes, step_s)
        elif num_decodes:
            self.decode_step_time.record(num_decodes, context_tokens, step_s, num_steps)


def _rate(s_per_unit: float) -> float | None:
    return 1 / s_per_unit if s_per_unit else None


def decode_step_of(config: SimConfig, context_tokens: int = 0) -> DecodeStepLoad:
    """The cost model's decode step as a replica's fit would report it."""
    cost = config.cost
    return DecodeStepLoad(step_s=cost.step_overhead_s + cost.decode_s_per_step, s_per_seq=cost.decode_s_per_seq,
                          s_per_context_token=cost.decode_s_per_context_token, context_tokens=context_tokens)


def sim_load_rates(load: ReplicaLoad, config: SimConfig, num_kv_blocks: int) -> None:
    """A new replica's rates in the router's view before any poll: the cost model's constants, and its cache's
    blocks (``num_kv_blocks``, its null block included, as its ``/load`` reports them)."""
    cost = config.cost
    load.num_kv_blocks = num_kv_blocks
    load.prefill_tokens_per_s = _rate(cost.prefill_s_per_token)
    load.kv_block_bytes = config.engine.block_size
    load.h2d_bytes_per_s = _rate(cost.load_s_per_token)
    load.kv_transfer_enabled = config.peer_pulls
    load.pull_bytes_per_s = config.kv_transfer_bytes_per_s / cache_bytes_per_token(config)
    load.pull_fixed_s = config.kv_transfer_latency_s
    load.decode_step = decode_step_of(config)


def sim_load_report(measures: SimMeasures, config: SimConfig, num_running: int, num_waiting: int,
                    kv_usage: float, waiting_prefill_tokens: int, context_tokens: int,
                    num_kv_blocks: int) -> LoadReport:
    """The replica's ``/load``: its load and what it measured (the cost model's constants until it measured);
    ``num_kv_blocks``: its cache's blocks, the null block included, as a live replica reports them."""
    cost, coef = config.cost, measures.decode_step_time.coefficients()
    decode = decode_step_of(config, context_tokens) if coef is None else DecodeStepLoad(
        step_s=coef[0], s_per_seq=coef[1], s_per_context_token=coef[2],
        num_steps=measures.decode_step_time.num_steps, context_tokens=context_tokens)
    transfer = KVTransferLoad(enabled=config.peer_pulls,
                              pull_bytes_per_s=config.kv_transfer_bytes_per_s / cache_bytes_per_token(config),
                              pull_fixed_s=config.kv_transfer_latency_s, bytes_per_token=1)
    return LoadReport(num_requests_running=num_running, num_requests_waiting=num_waiting, kv_cache_usage=kv_usage,
                      num_waiting_prefill_tokens=waiting_prefill_tokens, num_kv_blocks=num_kv_blocks,
                      block_size=config.engine.block_size,
                      max_num_seqs=config.engine.max_num_seqs,
                      prefill_tokens_per_s=measures.prefill_rate.tokens_per_s or _rate(cost.prefill_s_per_token),
                      kv_block_bytes=config.engine.block_size, h2d_bytes_per_s=_rate(cost.load_s_per_token),
                      kv_transfer=transfer, decode_step=decode)
