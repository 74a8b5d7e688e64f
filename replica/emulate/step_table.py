"""Measured step times as a profile: ``StepTimeTable``, read from a profile file.

Three file formats, told apart by their keys:

- what ``kvmesh bench engine-speed`` writes (``results/engine_<device>.json``): its first measured configuration's
  ``decode`` rows (seconds of a decode step at ``running_seqs`` sequences of ``context_tokens`` each) and its
  ``ttft`` (a cold prefill of ``prefix_len + new_tokens`` tokens, and a cached one of ``new_tokens``), so a lent
  GPU's run becomes a profile;
- a step-time table written by hand or by another tool::

      {"prefill": [[tokens, seconds], ...],                 # a prefill-only step computing that many tokens
       "decode": [[seqs, context_tokens, seconds], ...],    # a decode-only step of seqs sequences, each that long
       "decode_s_per_context_token": 0.0,                   # optional: seconds per context token off the rows'
       "load_s_per_token": 0.0,                             # optional: per token loaded back from the host tier
       "kv_bytes_per_token": 131072}                        # optional: sizes the KV cache from kv_cache_memory

- a linear cost model, ``{"cost_model": {"prefill_s_per_token": ..., ...}, "kv_bytes_per_token": ...}``: the
  fields of ``CostModel`` (cost_model.py; those left out keep the H100 8B's), as ``kvmesh bench emulated_fleet``
  writes for the simulator's miniature of a trace.

A table step's time is piecewise linear between the rows (extended by the end segments' slopes, never below 0; one row
alone is a line through zero):
prefill by tokens, decode by sequences (then ``decode_s_per_context_token`` times the context beyond the rows'
``seqs * context_tokens``); a mixed step costs its prefill's time plus its decode's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvmesh.replica.emulate.cost_model import H100_8B_KV_BYTES_PER_TOKEN, CostModel


@dataclass(frozen=True, slots=True)
class StepTimeTable:
    """Step times measured at a few batch shapes, interpolated between them."""

    prefill: tuple[tuple[float, float], ...]
    """(tokens, seconds) of prefill-only steps, tokens rising."""
    decode: tuple[tuple[float, float, float], ...]
    """(sequences, context tokens of each, seconds) of decode-only steps, sequences rising."""
    decode_s_per_context_token: float = 0.0
    """Seconds per context token beyond what the decode rows held."""
    load_s_per_token: float = 0.0
    """Seconds per prompt token loaded back from the host tier."""

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a step-time table needs at least one prefill row and one decode row")
        for row in (*self.prefill, *self.decode):
            if any(not (isinstance(v, int | float) and v >= 0) for v in row):
                raise ValueError(f"step-time table row {list(row)}: every value must be a number >= 0")
        if self.decode_s_per_context_token < 0 or self.load_s_per_token < 0:
            raise ValueError("decode_s_per_context_token and load_s_per_token must be >= 0 seconds")

    def step_time(self, num_prefill_tokens: int, num_decode_seqs: int, decode_context_tokens: int,
                  num_loaded_tokens: int = 0) -> float:
        """Seconds of one step (the ``CostModel.step_time`` signature)."""
        t = self.load_s_per_token * num_loaded_tokens
        if num_prefill_tokens:
            t += _interpolate([(n, s) for n, s in self.prefill], num_prefill_tokens)
        if num_decode_seqs:
            t += _interpolate([(b, s) for b, _, s in self.decode], num_decode_seqs)
            held = num_decode_seqs * _interpolate([(b, c) for b, c, _ in self.decode], num_decode_seqs)
            t += self.decode_s_per_context_token * max(0.0, decode_context_tokens - held)
        return t


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """y at ``x`` on the polyline through ``points`` (sorted by x), its end segments extended; never below 0."""
    if len(points) == 1:
        (x0, y0), = points
        return max(0.0, y0 * x / x0) if x0 else y0
    i = 1
    while i < len(points) - 1 and points[i][0] < x:
        i += 1
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0)) if x1 != x0 else y1


def load_profile_file(path: str) -> tuple[CostModel | StepTimeTable, int]:
    """The table in ``path`` and the KV bytes per token it says (the H100 8B's when it says none); ValueError
    naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"emulate profile {path!r} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"emulate profile {path!r}: expected a JSON object, got {type(data).__name__}")
    try:
        table = (_from_engine_speed(data) if data.get("bench") == "engine-speed" else
                 _from_cost_model(data) if "cost_model" in data else _from_table(data))
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ValueError(f"emulate profile {path!r} is neither an engine-speed result nor a step-time table "
                         f"(docs/emulated-fleet.md): {e!s}") from None
    kv_bytes = data.get("kv_bytes_per_token", H100_8B_KV_BYTES_PER_TOKEN)
    if not isinstance(kv_bytes, int) or kv_bytes < 1:
        raise ValueError(f"emulate profile {path!r}: kv_bytes_per_token must be a positive integer, got {kv_bytes!r}")
    return table, kv_bytes


def _from_cost_model(data: dict) -> CostModel:
    unknown = set(data) - {"cost_model", "kv_bytes_per_token", "name"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    fields = data["cost_model"]
    if not isinstance(fields, dict) or set(fields) - set(CostModel.__dataclass_fields__):
        raise ValueError(f"cost_model takes {sorted(CostModel.__dataclass_fields__)}")
    return CostModel(**fields)


def _from_table(data: dict) -> StepTimeTable:
    unknown = set(data) - {"prefill", "decode", "decode_s_per_context_token", "load_s_per_token",
                           "kv_bytes_per_token", "name"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    prefill = sorted((float(n), float(s)) for n, s in data["prefill"])
    decode = sorted((float(b), float(c), float(s)) for b, c, s in data["decode"])
    return StepTimeTable(tuple(prefill), tuple(decode), float(data.get("decode_s_per_context_token", 0.0)),
                         float(data.get("load_s_per_token", 0.0)))


def _from_engine_speed(data: dict) -> StepTimeTable:
    """The first configuration that measured decode steps and a TTFT."""
    config = next(c for c in data["configs"] if c.get("decode") and c.get("ttft"))
    decode = sorted((float(d["running_seqs"]), float(d["context_tokens"]), d["wall_ms_per_step"] / 1e3)
                    for d in config["decode"])
    ttft = config["ttft"]
    cold_tokens = ttft["prefix_len"] + ttft["new_tokens"]
    prefill = sorted({(float(ttft["new_tokens"]), ttft["cached"]["wall_ms"] / 1e3),
                      (float(cold_tokens), ttft["cold"]["wall_ms"] / 1e3)})
    return StepTimeTable(tuple(prefill), tuple(decode))
