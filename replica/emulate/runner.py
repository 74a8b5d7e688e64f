"""``EmulatedModelRunner``: the engine's model runner with no model, each step waiting out a GPU timing profile.

    LLMEngine ──execute_model(SchedulerOutput)──▶ EmulatedModelRunner
                  step's batch ─▶ profile.step_time(prefill tokens, decode seqs, their context, tokens loaded)
                  ─▶ EmulatedStepClock waits until the planned end ─▶ {request_id: token} from a hash

Everything around the forward pass is the real replica's: the scheduler, the KV cache manager and its events,
the host tier's bookkeeping (its copies land when their step ends), the HTTP layer. A sampled token is a hash of
the token before it and its position, drawn from the ids that are text on their own (``_text_ids``) without the
EOS ids (with ``emulate_eos``: one in ``EOS_EVERY`` is an EOS), so the same context gives the same tokens, a
preempted request resumes with the tokens it had, each token streams as a chunk of text, and stop strings, stop
tokens and ``max_tokens`` act as on a model. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kvmesh.replica.emulate.config import EmulationConfig
from kvmesh.replica.emulate.timing import EmulatedStepClock
from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest

if TYPE_CHECKING:
    from kvmesh.replica.emulate.cost_model import CostModel
    from kvmesh.replica.emulate.step_table import StepTimeTable
    from kvmesh.replica.step.scheduler_output import SchedulerOutput

FIRST_TEXT_ID = 3
"""Sampled ids start here: 0..2 are the special tokens (unknown, BOS, EOS) of Llama-family vocabularies."""
EOS_EVERY = 64
"""With ``emulate_eos``: one sampled token in this many is an EOS (outputs of ~64 tokens on average)."""
_MASK = (1 << 64) - 1


class EmulatedModelRunner:
    """Runs no model: a step waits for its profile time, then samples hashed tokens (one engine thread)."""

    def __init__(self, emulation: EmulationConfig, model_dir: str, block_size: int, kv_cache_memory: int,
                 kv_offload_memory: int | None = None, max_model_len: int | None = None,
                 hf_config: dict | None = None) -> None:
        self.profile: CostModel | StepTimeTable
        self.profile, kv_bytes_per_token = emulation.profile()
        self.emulate_eos = emulation.emulate_eos
        hf = hf_config if hf_config is not None else _read_json(Path(model_dir) / "config.json")
        self.vocab_size: int = hf["vocab_size"]
        self.max_model_len: int = max_model_len or hf.get("max_position_embeddings", 2048)
        self.eos_token_ids = _eos_ids(hf, Path(model_dir))
        self.block_size = block_size
        block_bytes = block_size * kv_bytes_per_token
        self.num_kv_blocks = max(2, kv_cache_memory // block_bytes)
        self.num_host_blocks = kv_offload_memory // block_bytes + 1 if kv_offload_memory else 0
        self.kv_offload = None  # no copies move: a tier's stores land when their step ends
        self.kv_layout = None  # no tensors
        self.device = "cpu"
        self.dead_reason: str | None = None
        self.clock = EmulatedStepClock(str(emulation.emulate), emulation.emulate_time_dilation)
        self.rows: dict[str, list[int]] = {}  # request_id -> [last token, context length]
        self._last_ids: set[str] = set()  # the previous step's requests
        self._landed: list[int] = []  # offload store jobs whose step ended
        self.loras: dict[str, LoRARequest] = {}
        self._ids = [t for t in _text_ids(Path(model_dir), self.vocab_size) if t not in self.eos_token_ids]
        if not self._ids:
            raise ValueError(f"emulate: vocab_size {self.vocab_size} leaves no token id to sample")

    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        for rid in out.finished_request_ids:
            self.rows.pop(rid, None)
        sampled: dict[str, int] = {}
        num_prefill = 0
        for sr in out.scheduled:
            end = sr.num_computed_tokens + len(sr.token_ids)
            num_prefill += len(sr.token_ids)
            self.rows[sr.request_id] = row = [sr.token_ids[-1], end]
            if sr.sample:
                sampled[sr.request_id] = self._sample(row)
        context = 0
        for rid in out.decode_request_ids:
            row = self.rows[rid]  # KeyError: the scheduler decodes an id this runner never saw
            context += row[1]
            sampled[rid] = self._sample(row)
        copies = out.offload_copies
        loaded = len(copies.loads) * self.block_size if copies is not None else 0
        ids = {sr.request_id for sr in out.scheduled} | set(out.decode_request_ids)
        seconds = self.profile.step_time(num_prefill, len(out.decode_request_ids), context, loaded)
        self.clock.run_step(seconds, continues=not ids.isdisjoint(self._last_ids))
        self._last_ids = ids
        if copies is not None and copies.stores:
            self._landed.append(copies.job_id)
        return sampled

    def _sample(self, row: list[int]) -> int:
        """The token after ``row``'s last at its context length; the row moves on by it."""
        h = ((row[0] + 1) * 0x9E3779B97F4A7C15 + row[1] * 0xBF58476D1CE4E5B9) & _MASK
        h = ((h ^ (h >> 31)) * 0x94D049BB133111EB) & _MASK
        h ^= h >> 29
        if self.emulate_eos and self.eos_token_ids and h % EOS_EVERY == 0:
            token = self.eos_token_ids[0]
        else:
            token = self._ids[(h >> 8) % len(self._ids)]
        row[0], row[1] = token, row[1] + 1
        return token

    def finished_offload_stores(self) -> list[int]:
        landed, self._landed = self._landed, []
        return landed

    def bind_thread(self) -> None:
        """No device: any thread may step."""

    def check_health(self, timeout_s: float = 10.0) -> str | None:
        return self.dead_reason

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Adapters are names here (no weights, tokens ignore them), identified by their path."""
        self.loras[lora.lora_name] = lora
        return LoadedLoRA(0, hashlib.sha256(lora.lora_path.encode()).hexdigest()[:32])

    def remove_lora(self, lora: LoRARequest) -> bool:
        if self.loras.get(lora.lora_name) != lora:
            return False
        return self.loras.pop(lora.lora_name) is not None

    def lora_residency(self) -> tuple[list[str], float | None]:
        return [], None

    def lora_load_seconds(self) -> float:
        return 0.0

    def shutdown(self) -> None:
        """Nothing to release."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"emulate: the model directory needs a config.json (vocab_size, max_position_embeddings, "
                         f"eos_token_id): {e}") from None


def _text_ids(model_dir: Path, vocab_size: int) -> list[int]:
    """The ids a model's text is made of: with the model's ``tokenizer.json``, those that decode on their own to
    printable text (a byte piece of a character, a control character or a special token would make the
    detokenizer hold text back or write what no model writes, so a stream's first chunk would come tokens late);
    without one, every id from ``FIRST_TEXT_ID``."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return list(range(FIRST_TEXT_ID, vocab_size))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    ids = range(FIRST_TEXT_ID, min(vocab_size, tokenizer.get_vocab_size()))
    texts = tokenizer.decode_batch([[t] for t in ids], skip_special_tokens=True)
    return [t for t, text in zip(ids, texts, strict=True)
            if text and "\ufffd" not in text and all(c.isprintable() or c in "\n\t" for c in text)]


def _eos_ids(hf: dict, model_dir: Path) -> list[int]:
    """EOS ids of config.json and generation_config.json (as the real runner reads them)."""
    ids: list[int] = []
    generation = model_dir / "generation_config.json"
    for source in (hf, _read_json(generation) if generation.is_file() else {}):
        eos = source.get("eos_token_id")
        for t in eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []:
            if t not in ids:
                ids.append(t)
    return ids
