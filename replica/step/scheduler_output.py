"""What the scheduler hands the model runner for one engine step.

The scheduler decides *which tokens of which requests* are computed this step; the model
runner turns that into tensors, runs the forward pass, writes the new K/V into the paged
cache and samples a token for every request whose computed tokens reach its end.

    request r: all_token_ids = [p0 p1 p2 ... p(n-1) | o0 o1 ...]   (prompt | output so far)
                               <- num_computed_tokens -><- token_ids of this step ->
    the K/V of positions [0, num_computed_tokens) are already in the cache at block_ids;
    this step computes positions [num_computed_tokens, num_computed_tokens + len(token_ids)).

Persistent batch (vLLM v1's "cached requests"): the runner keeps a row per live request. A request
that only continues decoding -- its one new token is the one the runner sampled for it last step --
is sent as its id alone (``decode_request_ids``), plus the ids of blocks it gained
(``new_block_ids``); everything else (new, resumed after preemption, prefill chunks) is a full
``ScheduledRequest`` that (re)sets the row. So a step's message and the runner's input work grow
with what changed, not with how many requests run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvmesh.kvcache.offload_copies import OffloadCopies
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step."""

    request_id: str
    """The engine's id of the request."""
    token_ids: list[int]
    """Tokens to compute this step (a prefill chunk, or the one newest token when decoding)."""
    num_computed_tokens: int
    """Position of ``token_ids[0]``: how many tokens already have K/V in the cache."""
    block_ids: list[int]
    """The request's whole block table (ids into the KV cache), covering every computed token."""
    sample: bool
    """True when this chunk reaches the request's last known token, so a new token is sampled."""
    sampling_params: SamplingParams
    """How to sample (only read when ``sample``)."""
    output_token_ids: list[int] = field(default_factory=list)
    """Tokens generated so far (seeded sampling derives its generator state from their count)."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter the request runs with (None: the base model); the runner keeps it with the row."""
    prompt_token_ids: list[int] | None = None
    """The whole prompt, sent for requests with penalties only (the runner marks its tokens; None: not sent)."""
    spec_token_ids: list[int] = field(default_factory=list)
    """Draft tokens, the last ``len(spec_token_ids)`` of ``token_ids``: the runner returns the target's argmax at
    each of them (``ModelRunnerOutput.draft_targets``) besides the token sampled after the last (spec_decode/)."""
    draft_probs: torch.Tensor | None = None
    """[len(spec_token_ids), V] the draft model's distribution each draft was sampled from (a sampled request
    with a draft model; None: greedy or n-gram drafts, spec_decode/rejection.py)."""


@dataclass(slots=True)
class GrammarBitmask:
    """The tokens the constrained rows of a step may sample (engine/structured_output.py fills it)."""

    request_ids: list[str]
    """The step's constrained requests that sample, one bitmask row each."""
    bitmask: np.ndarray
    """[len(request_ids), ceil(vocab_size / 32)] int32: bit t % 32 of word t // 32 set = token t allowed."""


@dataclass(slots=True)
class SchedulerOutput:
    """Everything one engine step computes. Requests are in the order the runner should batch them."""

    scheduled: list[ScheduledRequest]
    """Requests sent in full this step: new, resumed, prefill chunks (they (re)set the runner's row)."""
    num_batched_tokens: int
    """Sum of ``len(r.token_ids)``; never above ``max_num_batched_tokens``."""
    finished_request_ids: set[str] = field(default_factory=set)
    """Requests that ended since the last step (the runner drops any per-request state)."""
    decode_request_ids: list[str] = field(default_factory=list)
    """Running requests that decode one more token: the one the runner sampled for them last step."""
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)
    """Blocks appended this step to the block tables of requests in ``decode_request_ids``."""
    offload_copies: OffloadCopies | None = None
    """Copies between the device cache and the host tier around this step's forward (None: none)."""
    grammar_bitmask: GrammarBitmask | None = None
    """What the step's structured-output rows may sample, applied to their logits before sampling (None: none)."""

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.decode_request_ids

    @property
    def num_requests(self) -> int:
        return len(self.scheduled) + len(self.decode_request_ids)

    def request_ids(self) -> list[str]:
        """Every request of the step (full ones first, then the decode-only ones)."""
        return [sr.request_id for sr in self.scheduled] + self.decode_request_ids
