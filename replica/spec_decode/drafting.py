"""The scheduler's and the engine's side of speculative decoding (vLLM v1's spec-token flow).

    schedule:  a decoding request whose next input is its last token gets drafts (ngram_proposer.py, or
               draft_proposer.py for a draft model, whose q rows ride with the drafts) and is
               scheduled for 1 + K tokens: its last token and the drafts, slots for all of them; the runner
               computes the target's argmax at every position in one forward (``ScheduledRequest.spec_token_ids``)
    accept:    the longest prefix of drafts equal to the target's tokens is kept, plus one token of the target's
               own (the correction at the first mismatch, or the bonus after the last draft); the rejected
               drafts' slots are given back (``num_computed_tokens`` rolled back)

Drafts never enter ``all_token_ids`` until accepted, and the KV cache manager caches (hashes, stores, publishes
BlockStored for) only blocks of ``all_token_ids``: a rejected token's KV never becomes a cached block.

Greedy requests are verified by the target's argmax, sampled ones by rejection sampling (rejection.py). A
request that asks for penalties, logprobs, prompt logprobs, min_tokens, logit_bias, allowed_token_ids or a
grammar decodes one token per step (``SpecDecodeStats.num_ineligible`` counts them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kvmesh.replica.spec_decode.config import SpeculativeConfig
from kvmesh.replica.spec_decode.ngram_proposer import NgramProposer

if TYPE_CHECKING:
    import torch
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.spec_decode.draft_proposer import DraftModelInterface, DraftModelProposer
    from kvmesh.replica.step.outputs import ModelRunnerOutput
    from kvmesh.replica.step.scheduler_output import ScheduledRequest


LoadDraftModel = Callable[[], "DraftModelInterface"]
"""Loads the draft model of a ``speculative_config`` with method "draft_model" (the executor's
``local_draft_model`` for the engine's config, vocabulary, max_model_len and KV blocks)."""


class Request(Protocol):
    """What drafting reads and moves of the engine's ``Request``."""

    request_id: str
    sampling_params: SamplingParams
    all_token_ids: list[int]
    output_token_ids: list[int]
    num_computed_tokens: int
    spec_token_ids: list[int] | None


class Proposal(NamedTuple):
    """A draft model's drafts for a request, valid while it is the same request with as many tokens."""

    request: Request
    num_tokens: int
    drafts: list[int]
    probs: torch.Tensor | None
    """The drafts' q rows (a sampled request; None: greedy)."""


@dataclass(slots=True)
class SpecDecodeStats:
    """Cumulative counters (vLLM's ``vllm:spec_decode_*`` metrics)."""

    num_drafts: int = 0
    """Verification steps of a request with at least one draft token."""
    num_draft_tokens: int = 0
    """Draft tokens proposed and verified."""
    num_accepted_tokens: int = 0
    """Draft tokens accepted."""
    accepted_per_pos: list[int] = field(default_factory=list)
    """Accepted draft tokens by their position among a step's drafts (0 = the first draft)."""
    num_ineligible: int = 0
    """Requests that decode one token per step because their sampling settings are not verified here."""

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_drafts:
            self.accepted_per_pos += [0] * (num_drafts - len(self.accepted_per_pos))
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1


def can_speculate(request: Request) -> bool:
    """Whether the request's drafts can be verified: by the target's argmax (greedy) or by rejection sampling
    (rejection.py: temperature, top-k, top-p, min_p) with no other logits processing."""
    sp = request.sampling_params
    return (not sp.min_tokens and not sp.logit_bias and not sp.allowed_token_ids
            and sp.logprobs is None and sp.prompt_logprobs is None and not sp.penalized
            and sp.structured_outputs is None)


class Drafter:
    """Proposes drafts at scheduling time and accepts them when the step's tokens are read."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int,
                 draft_model: DraftModelProposer | None = None,
                 running: Callable[[], Iterable[Request]] = tuple) -> None:
        """``draft_model``: drafts of a draft model (method "draft_model"; ``running``: the scheduler's running
        requests, proposed for in one batch); None: n-gram drafts."""
        self.proposer = NgramProposer(config)
        self.draft_model, self.running = draft_model, running
        self.proposed: dict[str, Proposal] = {}  # the last batch's drafts not scheduled yet
        self.draft_probs: dict[str, torch.Tensor] = {}  # q rows of the drafts just proposed (sampled requests)
        self.max_model_len = max_model_len
        self.stats = SpecDecodeStats()

    def drafts_for(self, request: Request, budget: int) -> list[int]:
        """Drafts for a request whose next input is its last token ([] when none fit or none are found)."""
        if request.spec_token_ids is None:  # first look at it
            request.spec_token_ids = []
            if not can_speculate(request):
                self.stats.num_ineligible += 1
        self.draft_probs.pop(request.request_id, None)
        if not can_speculate(request):
            return []
        room = min(budget - 1, self._room(request))  # the drafts and the token after them fit the budget too
        if room <= 0:
            return []
        if self.draft_model is None:
            return self.proposer.propose(request.all_token_ids, room)
        proposal = self.proposed.pop(request.request_id, None)
        if proposal is None or proposal.request is not request or proposal.num_tokens != len(request.all_token_ids):
            self._propose_running(request)
            proposal = self.proposed.pop(request.request_id, Proposal(request, 0, [], None))
        drafts = proposal.drafts[:room]
        if proposal.probs is not None:
            self.draft_probs[request.request_id] = proposal.probs[:len(drafts)]
        return drafts

    def _room(self, request: Request) -> int:
        """Most drafts within max_tokens and max_model_len (the token sampled after them included)."""
        num_tokens = len(request.all_token_ids)
        return min(request.sampling_params.max_tokens - len(request.output_token_ids) - 1,
                   self.max_model_len - num_tokens)

    def _propose_running(self, request: Request) -> None:
        """The draft model's drafts for ``request`` and every running request whose next input is its last token,
        in one batch of forwards (draft_proposer.py); the draft cache of requests no longer running is freed."""
        from kvmesh.replica.spec_decode.draft_proposer import DraftRequest

        running = list(self.running())
        self.draft_model.release_others({r.request_id for r in running} | {request.request_id})
        batch = [request] + [r for r in running if r is not request and r.spec_token_ids is not None
                             and len(r.all_token_ids) == r.num_computed_tokens + 1 and can_speculate(r)]
        items = [DraftRequest(r.request_id, r.all_token_ids, self._room(r), r.sampling_params, len(r.output_token_ids))
                 for r in batch]
        proposals = self.draft_model.propose([item for item in items if item.max_drafts > 0])
        self.proposed = {r.request_id: Proposal(r, len(r.all_token_ids), *proposals[r.request_id])
                         for r in batch if r.request_id in proposals}

    def attach(self, sr: ScheduledRequest) -> ScheduledRequest:
        """``sr`` (scheduled with the drafts just proposed) with their q rows, when a draft model sampled them."""
        sr.draft_probs = self.draft_probs.pop(sr.request_id, None)
        return sr

    def accept(self, request: Request, targets: list[int], bonus: int) -> list[int]:
        """The tokens the step produced for ``request``: the accepted drafts then the target's own token;
        gives back the rejected drafts' slots."""
        drafts = request.spec_token_ids
        num_accepted = 0
        while num_accepted < len(drafts) and drafts[num_accepted] == targets[num_accepted]:
            num_accepted += 1
        request.num_computed_tokens -= len(drafts) - num_accepted
        self.stats.record(len(drafts), num_accepted)
        request.spec_token_ids = []
        return drafts[:num_accepted] + [targets[num_accepted] if num_accepted < len(drafts) else bonus]


def accept_drafts(drafter: Drafter, sampled: ModelRunnerOutput, requests: dict[str, Request]
                  ) -> list[dict[str, int]]:
    """Accept the step's drafts: ``sampled`` keeps each request's first token, and the later ones come back as
    one ``{request_id: token}`` per position, to be appended (and stop-checked) in that order."""
    rounds: list[dict[str, int]] = []
    for request_id, targets in sampled.draft_targets.items():
        request = requests.get(request_id)
        if request is None or request_id not in sampled:
            continue
        tokens = drafter.accept(request, targets, sampled[request_id])
        sampled[request_id] = tokens[0]
        for i, token in enumerate(tokens[1:]):
            if i == len(rounds):
                rounds.append({})
            rounds[i][request_id] = token
    return rounds


def make_drafter(spec: SpeculativeConfig | None, max_model_len: int, seed: int, load_draft_model: LoadDraftModel,
                 running: Callable[[], Iterable[Request]]) -> Drafter | None:
    """The engine's drafter for its speculative config ``spec`` (None: speculative decoding off); a draft model is
    loaded now by ``load_draft_model`` (raises ValueError when its vocabulary is not the target's) and drafts for
    the scheduler's ``running`` requests in one batch."""
    if spec is None:
        return None
    if spec.method != "draft_model":
        return Drafter(spec, max_model_len)
    from kvmesh.replica.spec_decode.draft_proposer import DraftModelProposer

    return Drafter(spec, max_model_len, DraftModelProposer(spec, load_draft_model(), seed), running)
