"""Which tokens of which requests run in the next step (vLLM v1's scheduler, nano-vllm's size).

One queue, no prefill/decode phases. Each step has a token budget (``max_num_batched_tokens``):

    1. running requests, oldest first, each gets the tokens it still lacks (a decode: 1; an unfinished
       prefill: the next chunk). When the KV cache has no room, the newest running request is preempted:
       its blocks are freed and it goes back to the front of the waiting queue, to be recomputed later
       (mostly from the prefix cache, since freed blocks stay cached until recycled).
       Under the "priority" policy (vLLM's) "oldest" and "newest" read as the smallest and the largest
       ``(priority, arrival_time)``: the running list is kept in that order, so the victim is the lowest
       priority's newest request, and a preempted request waits at its place in that order.
       A decode whose token the runner itself sampled last step is sent as its id alone (see
       scheduler_output.py, persistent batch).
    2. then, if nothing was preempted, waiting requests in the policy's order (request_queue.py): a prefix-cache lookup
       advances ``num_computed_tokens`` past the cached blocks, and the rest is scheduled as one chunk. A request
       whose ``kv_transfer_params`` ask a pull first asks the KV connectors (kv_connector.py) what another replica
       holds past that prefix, keeping its place while they find out; then waits in WAITING_FOR_REMOTE_KVS while
       the blocks are read (the other requests keep stepping) and, once ``get_finished`` names it, runs hitting
       them in the prefix cache. A failed or refused pull ends the wait too: the prompt is computed.

``num_computed_tokens`` is advanced when a chunk is scheduled (the runner computes it in the same step).
"""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.request import Request, RequestStatus
from kvmesh.replica.engine.request_queue import create_request_queue, priority_key
from kvmesh.replica.engine.scheduled_chunk import scheduled_chunk
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
    from kvmesh.replica.engine.kv_connectors import KVConnectors
    from kvmesh.replica.spec_decode.drafting import Drafter


class Scheduler:
    """Holds the waiting and running requests and turns them into one ``SchedulerOutput`` per step."""

    def __init__(self, config: EngineConfig, kv_cache_manager: KVCacheManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_caching = config.enable_prefix_caching
        self.block_size = config.block_size
        self.max_loras = config.max_loras if config.enable_lora else 0  # distinct adapters per step (0: no LoRA)
        self.kv_cache_manager = kv_cache_manager
        self.policy = config.scheduling_policy
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_request_ids: set[str] = set()
        self.num_preemptions = 0  # cumulative
        self.connector: KVConnectors | None = None
        """The engine's KV connectors (set by the engine): loads of KV held by other replicas."""
        self.finished_recving: set[str] = set()
        """Requests in WAITING_FOR_REMOTE_KVS whose load ended (``get_finished``): they run at their turn."""
        self.waits_only_for_remote = False
        """The last ``schedule`` found nothing to run but requests waiting for KV from other replicas."""
        self.left_waiting = 0
        """Requests the last ``schedule`` left waiting (no slot, token budget, KV, grammar or adapter slot for them);
        the rest of ``waiting`` came since and no step has tried them yet (engine/load_fields.py: ``queue_counts``)."""
        self.drafter: Drafter | None = None
        """Speculative decoding's drafts (set by the engine with ``speculative_config``; None: one token per step)."""

    # -- queue management -------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add_request(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request (finished, aborted or failed): drop it from its queue and free its blocks."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
            self.kv_cache_manager.free(request)
        else:  # waiting or preempted: holds no blocks
            self.waiting.remove_request(request)
        request.status = status
        request.finished_time = time.monotonic()
        self.finished_request_ids.add(request_id)
        self.finished_recving.discard(request_id)
        return request

    def finish_running(self, finished: list[Request]) -> None:
        """Free the blocks of requests that reached a final status while running (stop checks). With async
        scheduling a request preempted while its last token was in flight ends from the waiting queue."""
        if not finished:
            return
        done = {r.request_id for r in finished}
        running = len(self.running)
        self.running = [r for r in self.running if r.request_id not in done]
        now = time.monotonic()
        for request in finished:
            if running - len(self.running) < len(finished) and request in self.waiting:
                self.waiting.remove_request(request)  # preempted: holds no blocks
            else:
                self.kv_cache_manager.free(request)
            del self.requests[request.request_id]
            request.finished_time = now
        self.finished_request_ids |= done

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- one step ----------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.waits_only_for_remote = False
        if self.connector is not None:
            self.finished_recving |= self.connector.get_finished()
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        decode_ids: list[str] = []  # decodes of the runner's last samples: sent as ids (persistent batch)
        new_block_ids: dict[str, list[int]] = {}
        num_preemptions = self.num_preemptions
        block_size, append_decode = self.block_size, decode_ids.append
        for request in self.running:  # preemption pops from the end: victims are never reached
            if budget <= 0:
                break
            computed = request.num_computed_tokens
            if request.num_output_placeholders and request.structured_output is not None:
                continue  # async: its next mask needs the token in flight (engine/structured_output.py)
            # async scheduling: a token still on the device counts (the runner feeds it to this step itself)
            num_tokens = len(request.all_token_ids) + request.num_output_placeholders
            if num_tokens == computed:
                continue  # async scheduling: its last token is in flight and ends it (max_tokens)
            if self.drafter is not None and num_tokens == computed + 1 and (
                    drafts := self.drafter.drafts_for(request, budget)):  # its last token and drafts (spec_decode/)
                if not self._allocate_or_preempt(request, 1 + len(drafts)):
                    break  # the request itself was preempted (it was the newest)
                budget -= 1 + len(drafts)
                scheduled.append(self.drafter.attach(scheduled_chunk(request, 1, drafts)))
                continue
            if request.decoding_in_runner and num_tokens == computed + 1:
                budget -= 1
                if computed % block_size and num_tokens % block_size:
                    # Fast path: a token inside a partly filled block that it does not fill needs no new
                    # block and completes no block to cache, so allocate_slots would do nothing.
                    request.num_computed_tokens = num_tokens
                    append_decode(request.request_id)
                    continue
                if not self._decode_at_block_edge(request, decode_ids, new_block_ids):
                    budget += 1
                    break  # the request itself was preempted (it was the newest)
                continue
            num_new = min(num_tokens - computed, budget)
            budget -= num_new
            if not self._allocate_or_preempt(request, num_new):
                budget += num_new
                break  # the request itself was preempted (it was the newest)
            scheduled.append(scheduled_chunk(request, num_new))
        if self.num_preemptions == num_preemptions:  # no room was short: admit new work
            budget = self._schedule_waiting(scheduled, budget)
        out = SchedulerOutput(
            scheduled=scheduled,
            num_batched_tokens=self.max_num_batched_tokens - budget,
            finished_request_ids=self.finished_request_ids,
            decode_request_ids=decode_ids,
            new_block_ids=new_block_ids,
            offload_copies=self.kv_cache_manager.take_offload_copies(),
        )
        self.finished_request_ids = set()
        self.left_waiting = len(self.waiting)
        return out

    def _decode_at_block_edge(self, request: Request, decode_ids: list[str],
                              new_block_ids: dict[str, list[int]]) -> bool:
        """A decode by id whose token starts a new block or completes one (to be cached); False when the
        request itself had to be preempted."""
        num_blocks = len(request.block_ids)
        if not self._allocate_or_preempt(request, 1):
            return False
        request.num_computed_tokens += 1
        decode_ids.append(request.request_id)
        if len(request.block_ids) > num_blocks:
            new_block_ids[request.request_id] = request.block_ids[num_blocks:]
        return True

    def _allocate_or_preempt(self, request: Request, num_new: int) -> bool:
        """Make room for ``num_new`` tokens of a running request, preempting newer ones as needed."""
        while (new_blocks := self.kv_cache_manager.allocate_slots(request, num_new)) is None:
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return False
        if new_blocks:
            request.block_ids.extend([b.block_id for b in new_blocks])
        return True

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.block_ids = []
        request.decoding_in_runner = False  # the runner's row is stale: resend the request in full
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def _schedule_waiting(self, scheduled: list[ScheduledRequest], budget: int) -> int:
        """Admit waiting requests in the policy's order while budget, sequence slots and blocks last."""
        kv = self.kv_cache_manager
        num_remote = 0  # requests waiting for KV from other replicas
        # vLLM's max_loras check: the running requests' adapters plus the admitted ones stay within the slots;
        # a request of one more adapter waits (in its place) while later ones go ahead
        loras = ({r.lora_request.version for r in self.running if r.lora_request is not None} if self.max_loras
                 else None)
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting.peek_request()
            grammar = request.structured_output
            if grammar is not None and (not grammar.ready or request.num_output_placeholders):
                skipped.append(self.waiting.pop_request())  # its grammar compiles (or its token is in flight)
                continue
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not self._remote_kvs_ready(request):
                skipped.append(self.waiting.pop_request())
                num_remote += 1
                continue
            lora = request.lora_request  # per version: two weights of one name are two slots
            new_lora = loras is not None and lora is not None and lora.version not in loras
            if new_lora and len(loras) >= self.max_loras:
                skipped.append(self.waiting.pop_request())
                continue
            blocks, num_cached = kv.get_computed_blocks(request) if self.enable_caching else ([], 0)
            if request.remote_kv is not None and self._waits_for_remote(request, blocks, num_cached):
                skipped.append(self.waiting.pop_request())  # its adapter takes no slot while it waits
                num_remote += 1
                continue
            if new_lora:
                loras.add(lora.version)
            num_new = min(request.num_tokens - num_cached, budget)
            if kv.allocate_slots(request, num_new, num_cached, blocks) is None:
                break
            self.waiting.pop_request()
            if self.policy == "priority":  # running stays in (priority, arrival) order: the victim is last
                bisect.insort(self.running, request, key=priority_key)
            else:
                self.running.append(request)
            request.block_ids = kv.get_block_ids(request.request_id)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_cached
                if kv.offload is not None:  # the part past the device prefix comes from the host tier
                    request.num_host_cached_tokens = num_cached - len(blocks) * self.block_size
                request.first_scheduled_time = time.monotonic()
            scheduled.append(scheduled_chunk(request, num_new))
            budget -= num_new
        for request in reversed(skipped):  # back in their places, ahead of what was not reached
            self.waiting.prepend_request(request)
        self.waits_only_for_remote = bool(num_remote) and num_remote == len(self.requests)
        return budget

    def _waits_for_remote(self, request: Request, blocks: list[KVCacheBlock], num_cached: int) -> bool:
        """Whether ``request`` must wait for KV another replica holds past its ``num_cached`` local tokens: the
        connector does not know yet what there is, or now reads it (WAITING_FOR_REMOTE_KVS)."""
        if self.connector is None:
            return False
        num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_cached)
        if num_external is None:
            return True
        if not load_async or not num_external:
            return False
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.connector.update_state_after_alloc(request, blocks, num_external)
        return True

    def _remote_kvs_ready(self, request: Request) -> bool:
        """A request in WAITING_FOR_REMOTE_KVS whose load ended goes back to WAITING (True): it runs now."""
        if request.request_id not in self.finished_recving:
            return False
        self.finished_recving.discard(request.request_id)
        request.status = RequestStatus.WAITING
        return True
