"""One request's share of a step (``ScheduledRequest``), as the scheduler hands it to the runner."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.step.scheduler_output import ScheduledRequest

if TYPE_CHECKING:
    from kvmesh.replica.engine.request import Request


def scheduled_chunk(request: Request, num_new: int, drafts: list[int] | None = None) -> ScheduledRequest:
    """The step's entry for ``request``: its next ``num_new`` tokens (and ``drafts``, checked in the same forward),
    its computed count moved past them."""
    start = request.num_computed_tokens
    end = start + num_new
    request.num_computed_tokens = end + len(drafts or ())  # rejected drafts are given back (spec_decode/)
    all_token_ids = request.all_token_ids
    request.decoding_in_runner = end == len(all_token_ids) and not drafts  # the runner samples its next token
    # positional for speed: request_id, token_ids, num_computed_tokens, block_ids (the live block table,
    # extended as blocks are allocated), sample, sampling_params, output_token_ids, lora_request, prompt_token_ids
    sp = request.sampling_params
    if drafts:
        request.spec_token_ids = drafts
    return ScheduledRequest(request.request_id, all_token_ids[start:end] + drafts if drafts else
                            all_token_ids[start:end], start, request.block_ids, end == len(all_token_ids), sp,
                            request.output_token_ids, request.lora_request,
                            request.prompt_token_ids if sp.penalized else None, drafts or [])
