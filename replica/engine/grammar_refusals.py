"""Whose fault a constrained request's failure is: the request's (a constraint the engine cannot go on with) or
the engine's.

A grammar's mask and the request's other bans meet in the sampler: ``min_tokens`` bans the stop tokens,
``allowed_token_ids`` every other token. When nothing is left -- a grammar that matches no text at all
(``root ::= root``, a schema ``{"$ref": "#"}``), one that allows only the end while ``min_tokens`` asks for more, a
regex none of whose next tokens is in ``allowed_token_ids`` -- the sampler draws a token the grammar refuses.
``explain_refusal`` looks at the matcher (on the host, only then) to say which field the request must change;
a refused token the grammar did allow with nothing banning it means the runner ignored the mask, the engine's
fault. A grammar that failed to compile, or to compile in time, is its request's field too.

    the request's (field named)  ->  RequestOutput.error_param  ->  a 400, or a stream's finish_reason "error"
    the engine's (None)          ->  a 500 (replica/server/output_usage.py)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from kvmesh.replica.engine.xgrammar_backend import GrammarMatcher, allocate_bitmask, as_numpy

if TYPE_CHECKING:
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.engine.structured_output import StructuredOutputManager


def constraint_field(manager: StructuredOutputManager, request_id: str) -> str | None:
    """The request field of ``request_id``'s constraint (None: it has none)."""
    grammar = manager.live.get(request_id)
    return None if grammar is None else grammar.params.field


def allowed_tokens(matcher: GrammarMatcher, vocab_size: int) -> np.ndarray:
    """The token ids ``matcher`` allows next (its bitmask row, unpacked on the host)."""
    bitmask = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(as_numpy(bitmask)[0].view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


def explain_refusal(manager: StructuredOutputManager, request: Request, error: str) -> tuple[str, str | None]:
    """(message, the request field at fault) for a token ``request``'s grammar refused; the field is None, and
    the message ``error``, when the grammar allowed a token the request's other fields did not ban."""
    grammar = manager.live.get(request.request_id)
    if grammar is None or grammar.matcher is None:
        return error, None
    field, n = grammar.params.field, len(request.output_token_ids)
    allowed = set(allowed_tokens(grammar.matcher, manager.vocab_size).tolist())
    if not allowed:
        return (f"{field}: the constraint allows no token after {n} tokens of output: no text satisfies it (a rule "
                "or $ref that only refers to itself, a pattern that matches nothing); fix the constraint"), field
    sp = request.sampling_params
    if sp.min_tokens and n < sp.min_tokens and allowed <= request.stop_token_ids:
        return (f"min_tokens: {field} allows only the end of the output after {n} tokens, but min_tokens="
                f"{sp.min_tokens} asks for more; lower min_tokens or loosen the constraint"), "min_tokens"
    banned = request.stop_token_ids if sp.min_tokens and n < sp.min_tokens else frozenset()
    if sp.allowed_token_ids and not (allowed - banned) & set(sp.allowed_token_ids):
        return (f"allowed_token_ids: none of them is a token {field} allows after {n} tokens of output; allow "
                "the tokens the constraint needs or drop allowed_token_ids"), "allowed_token_ids"
    return error, None
