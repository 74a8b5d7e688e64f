"""Readers for public request traces: Mooncake ``hash_ids`` JSONL and Azure LLM inference CSV.

Read by the load generator (``kvmesh bench load``), the simulator (``kvmesh sim``) and the
component benchmarks. Pure stdlib; no torch.

Mooncake (FAST'25) lines look like::

    {"timestamp": 40, "input_length": 23769, "output_length": 3, "hash_ids": [151, 152, ...]}

``timestamp`` is in milliseconds; one hash id names one 512-token block of the prompt
(``len(hash_ids) == ceil(input_length / 512)``). Ids are chained: two requests share a prefix
exactly as far as their ``hash_ids`` agree. ``block_tokens.block_token_ids`` turns an id into a
deterministic block of token ids, so the prefix structure survives a replay through a real
tokenizer-free engine or router at any engine block size that divides the trace block size.

Azure (Splitwise, ISCA'24) CSVs have the header ``TIMESTAMP,ContextTokens,GeneratedTokens``
and carry no prefix information: use them for arrival times and lengths.

Every malformed line raises :class:`TraceError` naming the file and the 1-based line number.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kvmesh.cluster.measure.shared_dir import shared_path

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in the published Mooncake traces
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
DEFAULT_TRACE = "mooncake_synthetic_trace.jsonl"


def default_trace(name: str = DEFAULT_TRACE) -> str:
    """``$KVMESH_SHARED_DIR/traces/NAME`` (default: the checkout's sibling ``shared/``)."""
    return str(shared_path("traces", name))


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file and line."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path = str(path)
        self.line = line
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class MooncakeRecord:
    """One request of a Mooncake trace."""

    timestamp_ms: float
    """Arrival time in milliseconds from the start of the trace."""
    input_length: int
    """Prompt length in tokens."""
    output_length: int
    """Generated tokens."""
    hash_ids: tuple[int, ...]
    """One id per trace block of the prompt (chained prefix identity)."""

    @property
    def arrival_s(self) -> float:
        return self.timestamp_ms / 1000.0


@dataclass(frozen=True, slots=True)
class AzureRecord:
    """One request of an Azure LLM inference trace."""

    arrival_s: float
    """Arrival time in seconds from the first request of the file."""
    context_tokens: int
    """Prompt length in tokens."""
    generated_tokens: int
    """Generated tokens."""


def _open_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    p = Path(path)
    if not p.is_file():
        raise TraceError(p, None, "no such trace file (check the path; shared traces live in ../shared/traces)")
    with p.open("r", encoding="utf-8") as f:
        yield from enumerate(f, start=1)


def _int_field(obj: dict, key: str, path, lineno: int, minimum: int) -> int:
    if key not in obj:
        raise TraceError(path, lineno,
                         f"missing field {key!r} (expected timestamp, input_length, output_length, hash_ids)")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise TraceError(path, lineno, f"field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(path, lineno, f"field {key!r} must be >= {minimum}, got {value!r}")
    return int(value)


def parse_mooncake_line(line: str, path: str | Path = "<trace>", lineno: int = 1,
                        block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> MooncakeRecord:
    """Parse one JSONL line; raise :class:`TraceError` with ``path:lineno`` when it is malformed."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(path, lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0 or not math.isfinite(ts):
        raise TraceError(path, lineno, f"field 'timestamp' must be a number of milliseconds >= 0, got {ts!r}")
    input_length = _int_field(obj, "input_length", path, lineno, 1)
    output_length = _int_field(obj, "output_length", path, lineno, 0)
    hash_ids = obj.get("hash_ids")
    if not isinstance(hash_ids, list) or not hash_ids:
        raise TraceError(path, lineno, f"field 'hash_ids' must be a non-empty list of ints, got {hash_ids!r:.60}")
    if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids):
        raise TraceError(path, lineno, "field 'hash_ids' must hold only non-negative integers")
    if input_length > len(hash_ids) * block_tokens:
        raise TraceError(path, lineno, f"input_length {input_length} needs at least "
                         f"{math.ceil(input_length / block_tokens)} hash_ids of {block_tokens} tokens, "
                         f"got {len(hash_ids)}")
    return MooncakeRecord(float(ts), input_length, output_length, tuple(hash_ids))


def read_mooncake(path: str | Path, limit: int | None = None,
                  block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[MooncakeRecord]:
    """Read a Mooncake JSONL trace (blank lines skipped), sorted by timestamp; at most ``limit`` records."""
    records: list[MooncakeRecord] = []
    for lineno, line in _open_lines(path):
        if not line.strip():
            continue
        records.append(parse_mooncake_line(line, path, lineno, block_tokens))
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise TraceError(path, None, "trace holds no requests")
    records.sort(key=lambda r: r.timestamp_ms)  # stable: equal timestamps keep file order
    return records


def _parse_azure_time(text: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, more than datetime accepts.
    head, _, frac = text.strip().partition(".")
    dt = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    if frac:
        if not frac.isdigit():
            raise ValueError(f"bad fraction {frac!r}")
        dt = dt.replace(microsecond=int((frac + "000000")[:6]))
    return dt


def read_azure(path: str | Path, limit: int | None = None) -> list[AzureRecord]:
    """Read an Azure LLM inference CSV; arrival times are relative to the earliest request."""
    lines = _open_lines(path)
    try:
        _, header_line = next(lines)
    except StopIteration:
        raise TraceError(path, 1, "empty file; expected header " + ",".join(AZURE_COLUMNS)) from None
    header = [h.strip() for h in next(csv.reader([header_line]))]
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if missing:
        raise TraceError(path, 1, f"header lacks {missing}; expected {','.join(AZURE_COLUMNS)}")
    col = {name: header.index(name) for name in AZURE_COLUMNS}
    times: list[datetime] = []
    lengths: list[tuple[int, int]] = []
    for lineno, line in lines:
        if not line.strip():
            continue
        row = next(csv.reader([line]))
        try:
            t = _parse_azure_time(row[col["TIMESTAMP"]])
            ctx = int(row[col["ContextTokens"]])
            gen = int(row[col["GeneratedTokens"]])
        except (ValueError, IndexError) as e:
            raise TraceError(path, lineno, f"expected 'YYYY-MM-DD HH:MM:SS.frac,<int>,<int>', "
                             f"got {line.strip()!r:.80} ({e})") from None
        if ctx < 1 or gen < 0:
            raise TraceError(path, lineno, f"ContextTokens must be >= 1 and GeneratedTokens >= 0, got {ctx}, {gen}")
        times.append(t)
        lengths.append((ctx, gen))
        if limit is not None and len(times) >= limit:
            break
    if not times:
        raise TraceError(path, None, "trace holds no requests")
    t0 = min(times)
    records = [AzureRecord((t - t0).total_seconds(), c, g) for t, (c, g) in zip(times, lengths, strict=True)]
    records.sort(key=lambda r: r.arrival_s)
    return records
