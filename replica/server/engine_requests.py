"""The engine's view of one OpenAI request: one ``EngineRequest`` per candidate (each prompt of a batch, each of
``n`` / ``best_of`` choices; engine/engine_request.py), built here once from the validated body and carried
unchanged down to the scheduler. A per-request option the engine needs is one field of ``EngineRequest``, set
here from the body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.server import kv_request
from kvmesh.replica.server.parallel_sampling import Candidate, plan_candidates

if TYPE_CHECKING:
    from fastapi import Request
    from kvmesh.replica.engine.remote_kv import RemoteKV
    from kvmesh.replica.openai.protocol import ChatCompletionRequest
    from kvmesh.replica.server.state import ServerState
    from kvmesh.replica.serving.sampling_params import SamplingParams


def engine_requests(state: ServerState, http: Request, req: CompletionRequest | ChatCompletionRequest,
                    request_id: str, prompts: list[list[int]],
                    params: list[SamplingParams]) -> tuple[list[Candidate], RemoteKV | None]:
    """The request's candidates (``params[i]`` samples prompt i), and the remote KV its first one carries
    (``kv_transfer_params``: a pull before it runs, a lease at its end; kv_request.py)."""
    kv = kv_request.engine_params(state, req, prompts, http)
    first = EngineRequest(request_id, prompts[0], params[0], cache_salt=req.cache_salt, priority=req.priority,
                          lora_request=state.loras.request_for(req.model), remote_kv=kv)
    best_of = req.best_of if isinstance(req, CompletionRequest) else None
    return plan_candidates(first, prompts, params, req.n, best_of, params[0].logprobs is not None, req.stream), kv
