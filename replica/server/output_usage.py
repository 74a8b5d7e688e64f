"""What a request's engine outputs put in its answer: the usage (vLLM's counting for n / best_of / batches of
prompts) and, for a request the engine failed, its error: a 400 naming the field when the request caused it (a
constraint the engine could not go on with: replica/engine/grammar_refusals.py; a stream's choice ends with
``finish_reason: "error"`` instead), a 500 naming a request id when the engine did."""

from __future__ import annotations

import logging

from kvmesh.replica.openai.responses import UsageInfo
from kvmesh.replica.server.parallel_sampling import Candidate
from kvmesh.replica.serving.errors import ProtocolError, error_body, new_request_id
from kvmesh.replica.step.outputs import RequestOutput

logger = logging.getLogger(__name__)


def usage_of(out: RequestOutput) -> UsageInfo:
    """One request's usage: its prompt, its output, its cached tokens (on device and loaded back)."""
    return UsageInfo.of(len(out.prompt_token_ids), len(out.output_token_ids), out.num_cached_tokens,
                          out.num_host_cached_tokens)


def total_usage(candidates: list[Candidate], finals: list[RequestOutput]) -> UsageInfo:
    """Each prompt counted once, every candidate's tokens (vLLM's usage for n / best_of / batches)."""
    prompts = {c.prompt_index: f for c, f in zip(candidates, finals, strict=True) if c.sample_index == 0}
    return UsageInfo.of(sum(len(f.prompt_token_ids) for f in prompts.values()),
                          sum(len(f.output_token_ids) for f in finals),
                          sum(f.num_cached_tokens for f in prompts.values()),
                          None if any(f.num_host_cached_tokens is None for f in prompts.values())
                          else sum(f.num_host_cached_tokens for f in prompts.values()))


def check_failed(out: RequestOutput, stream: bool = False) -> None:
    """A request the engine failed because of a field of its own is a 400 naming it (``stream``: nothing raised,
    its chunk carries ``finish_reason: "error"``); one the engine failed by itself is a 500 naming a request id,
    what failed (an exception's text) logged."""
    if out.finish_reason != "error":
        return
    if out.error_param is not None:
        logger.info("request %s ended with its own error (%s): %s", out.request_id, out.error_param, out.error)
        if stream:
            return
        raise ProtocolError(out.error or f"{out.error_param} cannot be served", 400, out.error_param)
    request_id = new_request_id()
    logger.error("request %s failed inside the engine (request id %s): %s", out.request_id, request_id,
                 out.error or "unknown error")
    raise ProtocolError(f"request failed inside the engine (request id {request_id}); the replica's log has "
                        "the details", 500)


def own_error(out: RequestOutput) -> dict | None:
    """The error body of a request the engine failed because of a field of its own (what ``check_failed`` raises for a
    whole answer), for the last chunk of its stream; None for any other output."""
    if out.finish_reason != "error" or out.error_param is None:
        return None
    return error_body(out.error or f"{out.error_param} cannot be served", 400, out.error_param)["error"]
