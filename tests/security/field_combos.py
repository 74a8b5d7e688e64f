"""Combinations of request fields, generated from a seed: the fields of each endpoint's request model
(hostile_fields.py reads them), a few hostile values and a few valid ones in one body.

``combos(seed, per_endpoint)`` draws, for each endpoint, ``per_endpoint`` bodies: its plain request with 1-2 fields
set to one of their hostile values (hostile_values.py's by type, field_attacks.py's by meaning) and 1-3 others set
to a valid value that takes the request further in (a stream, several choices, logprobs, a constraint, a tool), so
the hostile one is read beside them. The same seed draws the same bodies (a failure names its seed and number:
``KVMESH_NOISY_SEED`` draws them again).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable

from .hostile_fields import ENDPOINTS, Endpoint, fields, values
from .hostile_values import Hostile
from .shots import Shot, post

_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_CONSTRAINED = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
_SAMPLING = {"temperature": (0.7,), "top_p": (0.5,), "seed": (1,), "stop": (["."],), "stream": (True,),
             "stream_options": ({"include_usage": True},), "user": ("u",), "top_k": (5,), "min_tokens": (2,),
             "presence_penalty": (0.5,), "repetition_penalty": (1.2,)}
VALID: dict[str, dict[str, tuple]] = {
    "/v1/completions": {**_SAMPLING, "n": (2,), "logprobs": (2,), "echo": (True,), "best_of": (2,),
                        "structured_outputs": ({"regex": "[a-z]+"},), "response_format": (_CONSTRAINED,),
                        "prompt": ([1, 2, 3], ["a", "b"])},
    "/v1/chat/completions": {**_SAMPLING, "n": (2,), "logprobs": (True,), "top_logprobs": (2,),
                             "tools": ([_TOOL],), "tool_choice": ({"type": "function", "function": {"name": "f"}},),
                             "response_format": (_CONSTRAINED, {"type": "json_object"}),
                             "structured_outputs": ({"choice": ["yes", "no"]},)},
    "/v1/responses": {"temperature": (0.7,), "stream": (True,), "store": (False,), "instructions": ("Be brief",),
                      "metadata": ({"a": "b"},), "user": ("u",), "parallel_tool_calls": (False,),
                      "tools": ([{"type": "function", "name": "f", "parameters": {"type": "object"}}],),
                      "tool_choice": ("required", {"type": "function", "name": "f"}),
                      "text": ({"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},),
                      "reasoning": ({"effort": "low"},),
                      "input": ([{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}],)},
}
"""Endpoint -> field -> valid values that take a request further in (the module doc)."""


def _write(endpoint: Endpoint, hostile: dict[str, Hostile], valid: dict[str, object]) -> bytes:
    """The plain request with ``valid`` set and each of ``hostile``'s raw JSON written at its (dotted) field."""
    body = copy.deepcopy(endpoint.plain) | valid
    for h in hostile.values():
        body.update(dict(h.also))
    for i, name in enumerate(hostile):
        *parents, last = name.split(".")
        at = body
        for part in parents:
            inner = at.setdefault(part, {}) if isinstance(at.get(part, {}), (dict, list)) else {}
            at = inner[0] if isinstance(inner, list) and inner and isinstance(inner[0], dict) else inner
        if isinstance(at, dict):
            at[last] = f"kvmesh-combo-{i}"
    text = json.dumps(body)
    for i, h in enumerate(hostile.values()):
        text = text.replace(json.dumps(f"kvmesh-combo-{i}"), h.text())
    return text.encode()


def _draw(rng: random.Random, endpoint: Endpoint,
          names: list[tuple[str, object]]) -> tuple[str, Callable[[], bytes]]:
    """A combination's label and what writes its body when sent (a huge value is megabytes)."""
    chosen = rng.sample(names, rng.randint(1, 2))
    hostile = {name: rng.choice(values(name, annotation)) for name, annotation in chosen}
    valid_names = sorted(set(VALID[endpoint.path]) - set(hostile))
    valid = {n: rng.choice(VALID[endpoint.path][n]) for n in rng.sample(valid_names, rng.randint(1, 3))}
    label = ", ".join([*(f"{n} = {h.label}" for n, h in hostile.items()), *(f"{n} = {v!r:.40}" for n, v in
                                                                             valid.items())])
    return label, lambda: _write(endpoint, hostile, valid)


def combos(seed: int, per_endpoint: int) -> list[Shot]:
    """The module doc's bodies, each a shot named by its seed and number and the fields it sets."""
    rng, out = random.Random(seed), []
    for endpoint in ENDPOINTS:
        names = sorted(fields(endpoint.model), key=lambda f: f[0])
        for i in range(per_endpoint):
            label, body = _draw(rng, endpoint, names)
            out.append(post(f"{endpoint.path} combo {seed}/{i}: {label}", body, endpoint.path))
    return out
