"""The knobs of the default policy, ``cache_aware_tokens`` (router/routing/policies/cache_aware_tokens.py, which says
what each term of its cost means)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvmesh.router.routing.policies.base import DEFAULT_DECODE_STEP_TOKENS, PolicyConfig

NEAR_PICKS = ("random", "prefix_hash")
"""The ways ``near_pick`` chooses among the near-equal cheapest candidates."""


@dataclass(frozen=True, slots=True)
class CacheAwareTokensConfig(PolicyConfig):
    """The knobs of ``cache_aware_tokens`` (in prefill-token units)."""

    decode_weight: float = 8.0
    """Prefill tokens one running request on a replica is worth."""
    backlog_weight: float = 0.15
    """Weight of the prompt tokens queued on a replica against the ones a cache hit saves."""
    temperature: float = 0.0
    """Softness of the choice in prefill tokens; 0 picks the cheapest replica."""
    near_share: float = 0.0
    """Where other routers book on the same replicas (``ReplicaLoad.other_routers``): draw the choice at random among
    the candidates costing at most this share of the cheapest one's uncached prompt tokens more than it (0.15 is
    about what queueing the request there adds to its cost for the next), so that routers deciding inside one burst
    on the same published load do not all send it to one replica. A router alone takes the cheapest. 0 (the
    default): every router takes the cheapest; in the simulator 0.15 cut a burst's excess TTFT but gave up hit share
    on steady conversation traffic (docs/benchmarks/several-routers.md)."""
    near_pick: str = "random"
    """How the choice among ``near_share``'s near-equal candidates is made: ``random`` (a draw), or ``prefix_hash``
    (rendezvous hashing of the prompt's first block no candidate holds over the candidates' ids: every router sends
    requests sharing a new prefix to the same one of them, different prefixes spread;
    router/routing/policies/prefix_rendezvous.py)."""
    session_slack_tokens: float = 0.0
    """How much more (in cost units, prefill tokens) a session's replica may cost than the cheapest one before the
    session is released to the cheapest. 0: the pin holds while its replica is among the cheapest; the index already
    keeps a conversation where its history is cached, and in the simulator every slack above 0 cost hit rate and
    balance (it overrides the load and turnover terms)."""
    churn_weight: float = 1.0
    """Eviction awareness: uncached tokens placed on a replica whose cache turns over faster than the mean
    (``recent_prefill``) evict younger, likelier-reused blocks; they cost ``1 + churn_weight * evicting * (churn /
    mean churn - 1)`` each instead of 1 (``evicting``: the share of its stores that evict, ``ReplicaLoad.evicting``;
    0 while its cache fills, where a token stored evicts nothing)."""
    turnover_while_filling: bool = True
    """Price turnover on every replica, evicting or not (``evicting`` read as 1), while any candidate has requests
    queued or running or no replica holds a block of the prompt; on an idle fleet, for a prompt some replica holds,
    only as far as the replica evicts (``idle_turnover``), so a conversation's next turn stays on its holder. False:
    as far as the replica evicts or the fleet is busy (``busy_turnover``); it holds the Mooncake headline but fails
    the chatbot cell at 2x on mean TTFT against ``dynamo`` (docs/benchmarks/routing-against-peers.md)."""
    idle_turnover: bool = False
    """With ``turnover_while_filling``, price turnover whole on an idle fleet too (no candidate with requests queued
    or running): the idle holder of a conversation then costs more than an idle replica that took in less, and its
    next turn is computed again elsewhere. False: a token stored where nothing is evicted pushes nothing out, so on an
    idle fleet a prompt some replica holds goes by its hit; a prompt nobody holds still goes where intake is lowest
    (it keeps the next requests' load even)."""
    busy_turnover: bool = True
    """Price turnover on a replica not evicting too, as far as the fleet is busy (the share of candidates with
    requests queued or running): spreading intake then evens the queues. On an idle fleet it would only copy a
    prompt away from its holder."""
    filling_backlog_weight: float | None = None
    """Weight of the queued prompt tokens while the fleet fills (no candidate evicting), going to ``backlog_weight``
    as the candidates' mean ``evicting`` goes from 0 to 1. None: ``backlog_weight`` throughout. 1: a copy of a prefix
    then evicts nothing, so a prompt's next request goes to its holder unless its queue costs more than recomputing
    the hit elsewhere (on the Mooncake trace at 2x it gave hits away while the fleet filled:
    docs/benchmarks/routing-against-peers.md)."""
    queue_share_weight: float = 0.0
    """Weight of a candidate's requests queued or running (``decode_load``) against the other candidates', as a share
    of the request's prompt: it costs ``queue_share_weight * prompt * (n - n_min) / (n_max - n_min) * overflow`` more
    (n its requests, n_min and n_max the fewest and most of any candidate; nothing where all are alike). Where a
    replica's KV cache holds only a request or two (the tool agents), a queued request waits for the running ones to
    end and free their blocks, a wait its queued prefill tokens do not measure and its request count does (llm-d's
    queue scorer normalises it so). 0 (the default): off; docs/benchmarks/routing-against-peers.md has its verdict."""
    queue_share_overflow: bool = True
    """Price ``queue_share_weight`` only as far as the candidate's requests overflow its KV cache: ``overflow = n x
    their mean prompt / its cache's tokens - 1``, clamped to [0, 1] (the mean of this router's recent requests there,
    the cache as its load reports ``num_kv_blocks``; 0 where it reports none), so the term is off where every
    request fits and a wait is a prefill queue, which the backlog term prices. False: ``overflow`` is 1 everywhere (in
    the simulator it then gave up hits where caches are large: docs/benchmarks/routing-against-peers.md)."""
    tail_knee: float | None = None
    """The load weight learned from the queue's tail (router/routing/queue_tail.py): queued prefill weighs
    ``backlog_weight`` while the recent requests' waits (their TTFT less their own prefill, the ``tail_quantile``)
    stay under this share of their TTFT target (a priority class's deadline, else ``admission.ttft_target_s``), and
    rises to ``tail_weight`` as they reach the target. None (the default): ``backlog_weight`` throughout (the
    simulator's verdict: docs/benchmarks/routing-against-peers.md)."""
    tail_quantile: float = 0.9
    """With ``tail_knee``: which quantile of the recent waits over their targets is the tail."""
    tail_window: int = 256
    """With ``tail_knee``: how many of this router's latest requests the tail is measured over."""
    tail_weight: float = 1.0
    """With ``tail_knee``: the weight queued prefill reaches when the tail reaches the target."""
    tail_overload: float = math.inf
    """With ``tail_knee``: the tail, in TTFT targets, at which the weight is back to ``backlog_weight`` (from
    ``tail_weight`` at the target, linearly): a fleet whose waits are far past the target lacks compute, and a hit
    saves it. inf: it stays at ``tail_weight``."""
    churn_clamp: float = 2.0
    """Bound of the churn ratio (a replica idle so far must not look free: ratio >= 1/clamp)."""
    backlog_release_tokens: float = math.inf
    """Queued prefill tokens beyond which the backlog counts in full (weight 1, not ``backlog_weight``): past this
    release point a hot replica sheds requests as a plain least-loaded router would, so its prefixes get replicated
    elsewhere. inf = never."""
    decode_step_tokens: float = DEFAULT_DECODE_STEP_TOKENS
    """Prefill tokens one engine step computes (the replicas' ``max_num_batched_tokens``: ``with_step_budget``).
    A running request slows every step, so it costs ``decode_weight`` per step until the new request's prefill is
    done: (queued + uncached prompt tokens) / this, at least 1. inf: always one step (the cost before it)."""
    ghost_weight: float | None = None
    """Eviction damage: a candidate's copy of blocks another replica holds costs ``ghost_weight`` x the share of
    stored blocks the fleet had evicted before (``comeback``, from the KV events: router/routing/eviction_ghosts.py)
    more per token (cost/stored_tokens.py). None: 1 (at face value) where pulls are priced, 0 elsewhere; 0: off."""
    price_pulls: bool = True
    """With peer pulls on, price the prefix a candidate with no prefill queued would pull from a peer at the pull's
    share of its compute time, not as computed tokens (cost/stored_tokens.py)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode_step_tokens", float(self.decode_step_tokens))
        for name in ("decode_weight", "backlog_weight", "near_share", "temperature", "session_slack_tokens",
                     "churn_weight", "filling_backlog_weight", "backlog_release_tokens", "ghost_weight",
                     "queue_share_weight"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.near_pick not in NEAR_PICKS:
            raise ValueError(f"near_pick must be one of {', '.join(NEAR_PICKS)}, got {self.near_pick!r}")
        if not self.decode_step_tokens > 0:
            raise ValueError(f"decode_step_tokens must be > 0, got {self.decode_step_tokens}")
        if self.tail_knee is not None and not 0 <= self.tail_knee < 1:
            raise ValueError(f"tail_knee must be in [0, 1) or unset, got {self.tail_knee}")
        if not 0 < self.tail_quantile <= 1:
            raise ValueError(f"tail_quantile must be in (0, 1], got {self.tail_quantile}")
        if not 0 <= self.tail_weight < math.inf:
            raise ValueError(f"tail_weight must be finite and >= 0, got {self.tail_weight}")
        if not self.tail_overload > 1:
            raise ValueError(f"tail_overload must be > 1, got {self.tail_overload}")
        if not self.tail_window >= 1:
            raise ValueError(f"tail_window must be >= 1, got {self.tail_window}")
        if not self.churn_clamp >= 1:
            raise ValueError(f"churn_clamp must be >= 1, got {self.churn_clamp}")
