"""Generated requests for LoRA adapters and several base models, in the ``hash_ids`` format.

``AdapterShape`` (a nested section of ``WorkloadShape``: ``--num-adapters``, ``--adapter-zipf``,
``--adapter-prefixes``, ``--num-models``, ``--base-share``) says how requests spread over adapters and models;
``adapter_requests`` makes them. Each adapter belongs to one base model (adapter ``i`` to model
``i % num_models``) and has prefixes of its own (``adapter_prefixes`` system prompts or documents, a share
``system_share`` of the prompt); a request picks its adapter by Zipf popularity (rank ``k`` drawn with weight
``1 / k ** adapter_zipf``), one of that adapter's prefixes uniformly, and adds a unique question. A share
``base_share`` of the requests names no adapter: a base model's own request (its model drawn uniformly), with
prefixes of that model's own.

Records are ``AdapterRecord``s: a ``SessionRecord`` with the ``model`` and ``lora_name`` a request names
(the simulator passes ``lora_name`` to the router and the replicas; the load generator sends
``"model": lora_name or model``).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from kvmesh.cluster.measure.workloads.generated import SessionRecord
from kvmesh.cluster.measure.workloads.traces import MOONCAKE_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class AdapterShape:
    """How the ``lora`` workload spreads its requests over LoRA adapters and base models."""

    num_adapters: int = 64
    """lora: LoRA adapters the requests name."""
    adapter_zipf: float = 1.1
    """lora: Zipf exponent of the adapters' popularity (0: uniform; 1.1: the top adapter ~1/5 of 64's requests)."""
    adapter_prefixes: int = 2
    """lora: prefixes (system prompts, documents) of each adapter's own; a request opens with one of them."""
    num_models: int = 1
    """lora: base models; adapter i adapts model i % num_models."""
    base_share: float = 0.0
    """lora: share of requests that name a base model and no adapter."""

    def __post_init__(self) -> None:
        if min(self.num_adapters, self.adapter_prefixes, self.num_models) < 1:
            raise ValueError(f"num_adapters, adapter_prefixes and num_models must be >= 1, got {self.num_adapters}, "
                             f"{self.adapter_prefixes} and {self.num_models}")
        if not self.adapter_zipf >= 0:
            raise ValueError(f"adapter_zipf must be >= 0 (0: uniform popularity), got {self.adapter_zipf}")
        if not 0 <= self.base_share <= 1:
            raise ValueError(f"base_share must be in [0, 1], got {self.base_share}")


@dataclass(frozen=True, slots=True)
class AdapterRecord(SessionRecord):
    """A request of a base model, or of one of its LoRA adapters."""

    model: str = ""
    """The base model it runs on (``model_name(i)``)."""
    lora_name: str | None = None
    """The adapter it names (``adapter_name(i)``; None: the base model itself)."""


def model_name(i: int) -> str:
    """The ``i``-th base model's served name in generated workloads."""
    return f"model-{i}"


def adapter_name(i: int) -> str:
    """The ``i``-th adapter's name (rank ``i`` in popularity: ``lora-0`` is the most requested)."""
    return f"lora-{i}"


def zipf_weights(n: int, exponent: float) -> list[float]:
    """Popularity of ranks ``1 .. n`` (``1 / k ** exponent``), normalized to sum 1."""
    raw = [1.0 / k ** exponent for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def adapter_requests(num_requests: int, prompt_tokens: int, shape: AdapterShape, *, system_share: float = 0.75,
                     rate: float = 1.0, output_tokens: int = 200, seed: int = 0) -> list[AdapterRecord]:
    """``num_requests`` single-turn requests, Poisson at ``rate`` per second, over ``shape``'s adapters and
    models; each opens with one of its adapter's (or base model's) prefixes, ``system_share`` of the prompt."""
    blocks = max(1, -(-prompt_tokens // MOONCAKE_BLOCK_TOKENS))
    system = min(blocks - 1, max(1, round(prompt_tokens * system_share / MOONCAKE_BLOCK_TOKENS))) if blocks > 1 else 0
    rng, ids = random.Random(seed), itertools.count()

    def prefixes() -> list[tuple[int, ...]]:
        return [tuple(next(ids) for _ in range(system)) for _ in range(shape.adapter_prefixes)]

    adapter_prefixes = [prefixes() for _ in range(shape.num_adapters)]
    model_prefixes = [prefixes() for _ in range(shape.num_models)]
    weights = zipf_weights(shape.num_adapters, shape.adapter_zipf)
    ranks = list(range(shape.num_adapters))
    t, out = 0.0, []
    for i in range(num_requests):
        t += rng.expovariate(rate)
        if rng.random() < shape.base_share:
            m, lora, own = rng.randrange(shape.num_models), None, model_prefixes
            prefix = own[m][rng.randrange(shape.adapter_prefixes)]
        else:
            a = rng.choices(ranks, weights)[0]
            m, lora = a % shape.num_models, adapter_name(a)
            prefix = adapter_prefixes[a][rng.randrange(shape.adapter_prefixes)]
        hash_ids = (*prefix, *(next(ids) for _ in range(blocks - system)))
        out.append(AdapterRecord(1000.0 * t, prompt_tokens, output_tokens, hash_ids, f"lora-req-{i}", system,
                                 model_name(m), lora))
    return out
