"""What a request's engine outputs put in its answer: the usage (vLLM's counting for n / best_of / batches of
prompts) and, for a request the engine failed, a 500 naming a request id."""

from __future__ import annotations

import logging

from kvmesh.replica.openai import responses as r
from kvmesh.replica.server import parallel_sampling as ps
from kvmesh.replica.serving.errors import ProtocolError, new_request_id
from kvmesh.replica.step.outputs import RequestOutput

logger = logging.getLogger(__name__)


def usage_of(out: RequestOutput) -> r.UsageInfo:
    """One request's usage: its prompt, its output, its cached tokens (on device and loaded back)."""
    return r.UsageInfo.of(len(out.prompt_token_ids), len(out.output_token_ids), out.num_cached_tokens,
                          out.num_host_cached_tokens)


def total_usage(candidates: list[ps.Candidate], finals: list[RequestOutput]) -> r.UsageInfo:
    """Each prompt counted once, every candidate's tokens (vLLM's usage for n / best_of / batches)."""
    prompts = {c.prompt_index: f for c, f in zip(candidates, finals, strict=True) if c.sample_index == 0}
    return r.UsageInfo.of(sum(len(f.prompt_token_ids) for f in prompts.values()),
                          sum(len(f.output_token_ids) for f in finals),
                          sum(f.num_cached_tokens for f in prompts.values()),
                          None if any(f.num_host_cached_tokens is None for f in prompts.values())
                          else sum(f.num_host_cached_tokens for f in prompts.values()))


def check_failed(out: RequestOutput) -> None:
    """A request the engine failed is a 500 naming a request id; what failed (an exception's text) is logged."""
    if out.finish_reason == "error":
        request_id = new_request_id()
        logger.error("request %s failed inside the engine (request id %s): %s", out.request_id, request_id,
                     out.error or "unknown error")
        raise ProtocolError(f"request failed inside the engine (request id {request_id}); the replica's log has "
                            "the details", 500)
