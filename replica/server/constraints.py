"""A request's structured-output constraints checked before it is queued: a bad schema, regex, choice or grammar is
the client's 400 (naming the field), found off the event loop and the engine thread."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kvmesh.replica.engine.structured_output import check_constraints
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams


async def checked_constraints(params: list[SamplingParams]) -> list[StructuredOutputsParams]:
    """The requests' structured-output constraints, each checked (a 400 for the first that cannot compile)."""
    if constraints := [sp.structured_outputs for sp in params if sp.structured_outputs is not None]:
        try:
            await asyncio.to_thread(check_constraints, constraints)
        except SamplingParamsError as e:
            raise ProtocolError(str(e), param=e.param) from None
    return constraints
