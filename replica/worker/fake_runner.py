"""A model-free stand-in for ``ModelRunner``: for scheduler tests and engine-overhead benchmarks.

It keeps a paged "KV cache" of token ids (one slot per token, like the real cache keeps K/V) and
samples from what it reads back through each request's block table, so wrong block tables, stale
prefix-cache hits or a mis-positioned chunk change the tokens, exactly as they would with a model.
"""

from __future__ import annotations

import hashlib
import time

from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
from kvmesh.replica.step.scheduler_output import SchedulerOutput


class FakeModelRunner:
    """Deterministic next token = a hash of the whole context as read back from the paged cache."""

    def __init__(self, num_kv_blocks: int = 64, block_size: int = 16, vocab_size: int = 1000,
                 max_model_len: int = 4096, eos_token_ids: tuple[int, ...] = (), read_back: bool = True) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = list(eos_token_ids)
        self.read_back = read_back  # False: skip the cache simulation (pure engine-overhead runs)
        self.hf_config = None
        self.device = "cpu"
        self.cache = [[-1] * block_size for _ in range(num_kv_blocks)]  # [num_blocks][block_size] token ids
        self.num_steps = 0
        self.fail_on: set[str] = set()  # request ids whose presence makes execute_model raise
        self.step_delay = 0.0  # seconds each step sleeps (to simulate a model's forward time)
        self.rows: dict[str, list] = {}  # request_id -> [block_ids, num_computed, last sampled token]
        self.dead_reason: str | None = None  # tests set it to play a broken TP group
        self.num_host_blocks = 0  # no host tier
        self.kv_offload = None
        self.kv_layout = None  # no tensors
        self.loras: dict[str, LoRARequest] = {}  # adapters added (names only: tokens ignore them)

    def finished_offload_stores(self) -> list[int]:
        return []

    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        self.num_steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)
        for rid in out.finished_request_ids:
            self.rows.pop(rid, None)
        sampled: dict[str, int] = {}
        for sr in out.scheduled:
            if sr.request_id in self.fail_on:
                raise RuntimeError(f"injected failure for {sr.request_id}")
            # a copy: the rows must follow new_block_ids, not the scheduler's live list
            row = self.rows[sr.request_id] = [list(sr.block_ids), sr.num_computed_tokens, None]
            self._run(sr.request_id, row, sr.token_ids, sr.sample, sampled)
        for rid in out.decode_request_ids:
            if rid in self.fail_on:
                raise RuntimeError(f"injected failure for {rid}")
            row = self.rows[rid]  # KeyError: the scheduler sent an id the runner has no row for
            assert row[2] is not None, f"{rid} decodes by id but this runner sampled nothing for it"
            row[0].extend(out.new_block_ids.get(rid, ()))
            self._run(rid, row, [row[2]], True, sampled)
        return sampled

    def _run(self, rid: str, row: list, token_ids: list[int], sample: bool, sampled: dict[str, int]) -> None:
        """Compute ``token_ids`` at the row's position; row = [block_ids, num_computed, last sampled]."""
        block_ids, start = row[0], row[1]
        row[1] = end = start + len(token_ids)
        row[2] = None
        if self.read_back:
            bs = self.block_size
            for j, tok in enumerate(token_ids):
                pos = start + j
                block_id = block_ids[pos // bs]
                assert block_id != 0, "wrote into the null block"
                self.cache[block_id][pos % bs] = tok
        if not sample:
            return
        if self.read_back:
            context = [self.cache[block_ids[p // bs]][p % bs] for p in range(end)]
            token = self.next_token(context)
        else:
            token = (start * 7 + len(token_ids)) % self.vocab_size
        row[2] = sampled[rid] = token

    def bind_thread(self) -> None:
        """No device, no graphs: any thread may step."""

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Adapters are names here (no weights): every one is accepted, weighs 0 bytes, and is identified by its
        path (another path: other weights)."""
        self.loras[lora.lora_name] = lora
        return LoadedLoRA(0, hashlib.sha256(lora.lora_path.encode()).hexdigest()[:32])

    def remove_lora(self, lora: LoRARequest) -> bool:
        if self.loras.get(lora.lora_name) != lora:
            return False  # another version of the name is current, or none
        return self.loras.pop(lora.lora_name) is not None

    def lora_residency(self) -> tuple[list[str], float | None]:
        return [], None

    def lora_load_seconds(self) -> float:
        return 0.0

    def check_health(self, timeout_s: float = 10.0) -> str | None:
        return self.dead_reason

    def shutdown(self) -> None:
        """Nothing to release."""

    def next_token(self, context: list[int]) -> int:
        """The token this runner samples after ``context`` (tests compute expected outputs with it)."""
        h = 1469598103934665603
        for t in context:
            h = ((h ^ (t + 1)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        return h % self.vocab_size

    def reference_generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        """What greedy generation gives without any cache (the expected output)."""
        ctx = list(prompt)
        for _ in range(max_tokens):
            ctx.append(self.next_token(ctx))
        return ctx[len(prompt):]
