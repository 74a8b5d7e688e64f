"""The simulated replica: a real ``KVCacheManager`` with a continuous-batching scheduler whose step time
comes from the cost model; it serves simulated requests (request.py). Its role (``both``, ``prefill``,
``decode``) only decides what the router sends it (router.py); a replica serves whatever it gets alike.

Scheduling mirrors the engine (DESIGN.md, "Scheduler"): one queue, a token budget per step,
running requests first (one token per decoding sequence, then prefill chunks), then waiting
requests in arrival order (by priority, then arrival, under ``scheduling_policy="priority"``:
priority.py). A request's blocks are allocated in full on admission (prompt + output), so it never
needs preemption; it waits while they do not fit. Blocks are freed on
completion and stay findable (lazy LRU) until recycled.

A step that only decodes is simulated as a *stretch* of ``k`` identical steps that ends at the
next completion; an arrival interrupts the stretch after the step in progress (see
:meth:`SimReplica.interrupt`). Step time inside a stretch uses the context lengths at its
start (a sub-percent error: outputs are short next to prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.lora import LoRASlots
from kvmesh.cluster.measure.sim.measured import SimMeasures, sim_load_report
from kvmesh.cluster.measure.sim.priority import waiting_queue
from kvmesh.cluster.measure.sim.request import SimRequest, cut_trace, requests_from_mooncake

if TYPE_CHECKING:
    from kvmesh.replica.serving.load_report import LoadReport

__all__ = ["SimReplica", "SimRequest", "Step", "cut_trace", "requests_from_mooncake"]


@dataclass(slots=True)
class Step:
    """A planned step (or stretch of ``num_steps`` identical decode steps)."""

    start_s: float
    step_s: float  # duration of one step
    num_steps: int
    prefill_chunks: list[tuple[SimRequest, int]]  # (request, tokens computed this step)
    decodes: list[SimRequest]
    context_tokens: int = 0  # the decodes' summed context at the step's start

    @property
    def end_s(self) -> float:
        return self.start_s + self.step_s * self.num_steps


class SimReplica:
    def __init__(self, replica_id: str, num_blocks: int, config: SimConfig, hash_seed: bytes, role: str = "both"):
        from kvmesh.kvcache.kv_cache_manager import KVCacheManager

        self.replica_id = replica_id
        self.role = role
        """``both``, ``prefill`` or ``decode``: what the router sends it (router.py)."""
        self.config = config
        self.num_blocks = num_blocks
        self.pending_events: list = []
        # +1: block 0 is the null block, so `num_blocks` stay usable.
        # the host tier: +1 for its own null block
        num_host_blocks = config.offload_blocks_per_replica + 1 if config.offload_blocks_per_replica else 0
        self.kv = KVCacheManager(num_blocks + 1, config.engine.block_size, hash_seed,
                                 event_sink=self.pending_events.append, num_host_blocks=num_host_blocks)
        self.waiting = waiting_queue(config.engine)  # the engine's scheduling policy (sim/priority.py)
        self.running: list[SimRequest] = []
        self.step: Step | None = None
        self.lora = LoRASlots(config.lora)
        """Its LoRA adapters' device slots (sim/lora.py)."""
        self.version = 0  # bumped when a planned step is cut short (stale heap entries are skipped)
        # -- measured --
        self.busy_s = 0.0
        self.num_steps = 0
        self.prefill_tokens = 0
        self.loaded_tokens = 0  # loaded back from the host tier
        self.num_requests = 0
        self.measures = SimMeasures()
        """Its prefill rate and decode step time, measured on its own steps as a real replica does."""
        self.inter_token_s: dict[float, int] = {}
        """Inter-token latency histogram: a decode step's seconds (to 10 us) -> tokens it gave its sequences."""

    # -- load, as a router would see it ---------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def load_report(self) -> LoadReport:
        """What the replica's ``/load`` would answer now, its measured rates included (sim/measured.py)."""
        reqs = [*self.waiting, *self.running]
        return sim_load_report(self.measures, self.config, len(self.running), len(self.waiting), self.kv.usage,
                               sum(r.remaining_prefill for r in reqs), sum(r.context_len for r in self.running),
                               self.num_blocks + 1)  # its null block too

    def blocks_needed(self, req: SimRequest) -> int:
        return math.ceil((req.num_prompt_tokens + req.max_output_tokens) / self.config.engine.block_size)

    def add(self, req: SimRequest) -> None:
        if self.blocks_needed(req) > self.num_blocks:
            raise ValueError(f"{req.request_id} needs {self.blocks_needed(req)} blocks of "
                             f"{self.config.engine.block_size} tokens; a replica holds {self.num_blocks}: "
                             "raise --blocks-per-replica or --capacity-fraction")
        self.waiting.append(req)
        self.num_requests += 1

    # -- scheduling --------------------------------------------------------------------
    def _admit(self, req: SimRequest) -> bool:
        computed_blocks, num_cached = self.kv.get_computed_blocks(req)
        num_new = req.num_prompt_tokens + req.max_output_tokens - num_cached
        if self.kv.allocate_slots(req, num_new, num_cached, computed_blocks) is None:
            return False
        # a transfer (sim/transfer.py) brought the leading pull_extent_tokens: cached, as the replica reports them
        req.num_cached_tokens = req.num_computed_tokens = max(num_cached, req.pull_extent_tokens)
        req.num_host_cached_tokens = num_cached - len(computed_blocks) * self.config.engine.block_size
        return True

    def schedule(self, now: float) -> Step | None:
        """Plan the next step at ``now``; None when there is nothing to run."""
        cfg = self.config
        budget = cfg.engine.max_num_batched_tokens
        decodes = [r for r in self.running if r.prefill_done]
        budget -= len(decodes)
        chunks: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if not r.prefill_done and budget > 0:
                n = min(r.remaining_prefill, budget)
                chunks.append((r, n))
                budget -= n
        passed_over: list[SimRequest] = []  # waiting for a LoRA slot: later requests go first (as vLLM)
        lora_load_s = 0.0
        while self.waiting and budget > 0 and len(self.running) < cfg.engine.max_num_seqs:
            req = self.waiting[0]
            if not self.lora.fits(req, self.running):
                passed_over.append(self.waiting.popleft())
                continue
            if not self._admit(req):
                break
            self.waiting.popleft()
            lora_load_s += self.lora.admit(req, self.running)
            self.running.append(req)
            req.admitted_s = now
            n = min(req.remaining_prefill, budget)
            chunks.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(passed_over))
        if not chunks and not decodes:
            if self.waiting:  # nothing runs, yet the head does not fit: cannot happen (checked in add)
                raise RuntimeError(f"replica {self.replica_id}: {self.waiting[0].request_id} cannot be admitted")
            self.step = None
            return None
        num_prefill = sum(n for _, n in chunks)
        # copies to and from the host tier: loads delay this step; stores land with it (on a side stream)
        copies = self.kv.take_offload_copies()
        num_loaded = 0 if copies is None else len(copies.loads) * cfg.engine.block_size
        if copies is not None:
            self.kv.complete_offload_stores([copies.job_id])
            self.loaded_tokens += num_loaded
        context = sum(r.context_len for r in decodes)
        step_s = cfg.cost.step_time(num_prefill, len(decodes), context, num_loaded)
        step_s += lora_load_s  # the step waits for its adapters' loads into their slots
        num_steps = min(r.remaining_output for r in decodes) if not chunks else 1
        self.step = Step(now, step_s, num_steps, chunks, decodes, context)
        return self.step

    def interrupt(self, now: float) -> float | None:
        """Cut a decode stretch short after the step running at ``now``; returns the new end
        time (the caller reschedules it under the new ``version``), or None if unchanged."""
        step = self.step
        if step is None or step.num_steps == 1:
            return None
        done = min(step.num_steps, int((now - step.start_s) / step.step_s) + 1)
        if done >= step.num_steps:
            return None
        step.num_steps = done
        self.version += 1
        return step.end_s

    def complete_step(self, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply the planned step's work; returns (requests that got their first token,
        requests that finished). Finished requests' blocks are freed."""
        step = self.step
        assert step is not None
        self.step = None
        self.busy_s += step.step_s * step.num_steps
        self.num_steps += step.num_steps
        self.measures.record(sum(n for _, n in step.prefill_chunks), len(step.decodes), step.context_tokens,
                             step.step_s, step.num_steps)
        first, finished = [], []
        for r in step.decodes:
            r.num_output_tokens += step.num_steps
        if step.decodes:  # each decoding sequence waited one step for each of its tokens
            key = round(step.step_s, 5)
            self.inter_token_s[key] = self.inter_token_s.get(key, 0) + step.num_steps * len(step.decodes)
        for r, n in step.prefill_chunks:
            r.num_computed_tokens += n
            self.prefill_tokens += n
            if r.prefill_done:  # the step that computes the last prompt token samples the first output token
                r.num_output_tokens = 1
                r.first_token_s = now
                first.append(r)
        still = []
        for r in self.running:
            if r.prefill_done and r.remaining_output <= 0:
                r.finished_s = now
                self.kv.free(r)
                r.all_token_ids = []  # drop the tokens; the pool keeps the blocks
                finished.append(r)
            else:
                still.append(r)
        self.running = still
        return first, finished

    def take_events(self) -> list:
        events = self.pending_events[:]
        self.pending_events.clear()
        return events
