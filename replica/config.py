"""How one replica's engine is built: model, KV cache sizing, scheduler budgets (vLLM's ``EngineConfig``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvmesh.replica.emulate.config import EmulationConfig
from kvmesh.replica.serving.grammar_config import StructuredOutputsConfig
from kvmesh.replica.serving.json_types import JSONObject
from kvmesh.replica.spec_decode.config import parse_speculative_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's --dtype also takes these names
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's --kv-cache-dtype ("fp8" is fp8_e4m3)
LOAD_FORMATS = ("auto", "safetensors", "dummy")
DEVICES = (None, "cpu", "cuda")
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy
DEFAULT_KV_CACHE_MEMORY = 1 << 30  # bytes of KV cache on CPU when kv_cache_memory is None (CUDA: profiled)
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything needed to build one replica's engine. Validated on construction; immutable."""

    model: str
    """Hugging Face directory or hub id of the model (or any name when ``load_format="dummy"`` with ``hf_config``)."""
    tokenizer: str | None = None
    """Tokenizer directory or hub id; None uses ``model``."""
    dtype: str = "auto"
    """Weight/activation dtype: "float32", "bfloat16", "float16", or "auto" (the model's; float32 on CPU); vLLM's
    "half" and "float" are taken as float16 and float32."""
    load_format: str = "auto"
    """"safetensors" reads weights, "dummy" makes random ones (benchmarks), "auto" = safetensors if present."""
    block_size: int = 16
    """Tokens per KV cache block (every replica of one cluster must use the same)."""
    max_model_len: int | None = None
    """Longest sequence (prompt + output) served; None uses the model's ``max_position_embeddings``."""
    max_num_seqs: int = 256
    """Most requests running in one step."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step (prefill chunks + decode tokens)."""
    kv_cache_memory: int | str | None = None
    """KV cache per replica, bytes or a size such as "512MiB": on CPU the size (None: 1 GiB), on CUDA a cap on what
    gpu_memory_utilization leaves (None: all of it)."""
    kv_cache_dtype: str = "auto"
    """KV cache element type (vLLM's --kv-cache-dtype): "auto" (the model's dtype), "fp8" or "fp8_e4m3", "fp8_e5m2"
    (one byte per value with per-layer k/v scales from the checkpoint, else 1.0: about twice the blocks)."""
    kv_offload_memory: int | str | None = None
    """Host-memory KV tier per replica below the device cache, bytes or a size such as "64MiB" (vLLM's
    --kv-offloading-size): pinned on CUDA; cached blocks are copied down and loaded back for later hits. None: no
    tier."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory the replica may use (weights + activations + KV cache), in (0, 1]."""
    num_kv_blocks: int | None = None
    """Cap on the KV blocks the scheduler may use (tests force preemption with a small pool); None = all."""
    enable_prefix_caching: bool = True
    """Reuse cached KV blocks of identical prefixes."""
    eviction_policy: str = "lru"
    """Which free cached block is recycled first (kvcache eviction policy registry name)."""
    tensor_parallel_size: int = 1
    """Number of ranks the model is sharded over."""
    attention_backend: str | None = None
    """Attention backend registry name ("torch", "flash_attn", "triton"); None: triton on CUDA (flash_attn at
    block sizes that are multiples of 256 when installed), torch on CPU."""
    cuda_graphs: bool | None = None
    """Replay decode-only steps, and one-request steps of a query up to 64 tokens (a short suffix over a cached
    prefix), from CUDA graphs; None: on with CUDA and tensor_parallel_size 1 when the backend has a static decode
    path (triton: any block size; flash_attn: block_size % 256 == 0), else off."""
    async_scheduling: bool | None = None
    """Schedule step N+1 while step N runs on the device (vLLM's async scheduling; same tokens); None: on
    for CUDA, off elsewhere. Needs a runner that launches steps without waiting (tensor_parallel_size 1)."""
    device: str | None = None
    """"cpu" or "cuda"; None (or "auto") uses cuda when available, else cpu."""
    seed: int = 0
    """Seed for dummy weights and for sampling requests that bring no seed of their own."""
    hash_seed: str | None = field(default=None, repr=False, metadata={"env": "KVMESH_HASH_SEED"})
    """Secret seed of the block hash chain, the same on every replica; None -> generated (bytes also accepted)."""
    hf_overrides: JSONObject | None = None
    """Values that replace fields of the model's HF config (e.g. ``{"num_hidden_layers": 2}``)."""
    hf_config: JSONObject | None = None
    """A whole HF config as a dict, for dummy models without a directory (used instead of reading ``model``)."""
    debug_check_integrity: bool = False
    """Run ``KVCacheManager.check_integrity()`` after every engine step (tests and debugging; a large pool is
    checked by the blocks in use and a window sweeping the rest, not walked whole)."""
    enable_lora: bool = False
    """Serve LoRA adapters (vLLM's --enable-lora): requests of the base model and of several adapters share a step."""
    max_loras: int = 1
    """Most distinct LoRA adapters in one step's batch (the device slots of adapter weights)."""
    max_lora_rank: int = 16
    """Largest LoRA rank served; an adapter of a higher rank is refused when it is added."""
    max_cpu_loras: int | None = None
    """LoRA adapters kept loaded in host memory (least recently used dropped first); None: max_loras."""
    lora_modules: dict[str, str] = field(default_factory=dict)
    """LoRA adapters registered at start, name -> PEFT directory (vLLM's --lora-modules name=path ...)."""
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    """How grammars compile and are cached (serving/grammar_config.py)."""
    scheduling_policy: str = "fcfs"
    """Which waiting request runs first (vLLM's --scheduling-policy): "fcfs" in arrival order (a request's non-zero
    ``priority`` is refused), "priority" by the request's ``priority`` (lower first) then arrival, preempting the
    largest (priority, arrival) first."""

    emulation: EmulationConfig = field(default_factory=EmulationConfig, metadata={"prefix": ""})
    """An emulated replica (``--emulate PROFILE``): no model runs, each step waits out a GPU timing profile
    (replica/emulate/); the tokenizer and the model's config.json are still read from ``model``."""
    speculative_config: JSONObject | None = None
    """Speculative decoding in vLLM's JSON form, ``{"method": "ngram", "num_speculative_tokens": 4,
    "prompt_lookup_min": 2, "prompt_lookup_max": 5}`` or a draft model's ``{"model": "/path", "num_speculative_tokens":
    4}``; turns async scheduling off. None: off."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_memory", parse_size(self.kv_cache_memory, "kv_cache_memory"))
        object.__setattr__(self, "kv_offload_memory", parse_size(self.kv_offload_memory, "kv_offload_memory"))
        if self.device == "auto":
            object.__setattr__(self, "device", None)
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        if not self.model:
            raise ValueError("model must be a Hugging Face directory or hub id, got an empty string")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        _check_positive_int("block_size", self.block_size)
        _check_positive_int("max_num_seqs", self.max_num_seqs)
        _check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _check_positive_int("tensor_parallel_size", self.tensor_parallel_size)
        for name in ("max_model_len", "kv_cache_memory", "kv_offload_memory", "num_kv_blocks"):
            if getattr(self, name) is not None:
                _check_positive_int(name, getattr(self, name))
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is the null block), got {self.num_kv_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.kv_offload_memory is not None and not self.enable_prefix_caching:
            raise ValueError("kv_offload_memory (a host tier of cached blocks) needs enable_prefix_caching; "
                             "turn prefix caching on or unset kv_offload_memory")
        if self.kv_offload_memory is not None and self.tensor_parallel_size > 1:
            raise ValueError("kv_offload_memory (a host tier) works with tensor_parallel_size 1 only for now; "
                             "unset it or use one rank")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
        if self.async_scheduling not in (None, True, False):
            raise ValueError(f"async_scheduling must be true, false or null (auto), got {self.async_scheduling!r}")
        _check_lora(self)
        spec = parse_speculative_config(self.speculative_config)
        if spec is not None and spec.method == "draft_model" and self.tensor_parallel_size > 1:
            raise ValueError("speculative_config.model (a draft model) runs in the engine's process: it works with "
                             "tensor_parallel_size 1 only for now; use one rank or method 'ngram'")
        if self.speculative_config is not None and self.async_scheduling:
            raise ValueError("speculative_config needs async_scheduling off (it verifies drafts on the host "
                             "between steps); set async_scheduling to false or null")
        if self.emulation.enabled and (self.tensor_parallel_size > 1 or self.speculative_config is not None):
            raise ValueError("emulate runs no model: it takes tensor_parallel_size 1 and no speculative_config "
                             "(the profile's step times are the whole group's)")
        if self.hash_seed is not None and not isinstance(self.hash_seed, bytes | str):
            raise ValueError("hash_seed must be bytes or str (or None to generate one)")

    @property
    def tokenizer_path(self) -> str:
        """Where the tokenizer is loaded from."""
        return self.tokenizer or self.model

    @property
    def resolved_kv_cache_memory(self) -> int:
        """Bytes of KV cache on CPU."""
        return self.kv_cache_memory if self.kv_cache_memory is not None else DEFAULT_KV_CACHE_MEMORY

    @property
    def resolved_max_cpu_loras(self) -> int:
        """LoRA adapters kept in host memory."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


def _check_lora(config: EngineConfig) -> None:
    """The LoRA fields: positive sizes, host cache >= slots, adapters only with enable_lora."""
    _check_positive_int("max_loras", config.max_loras)
    _check_positive_int("max_lora_rank", config.max_lora_rank)
    if config.max_cpu_loras is not None:
        _check_positive_int("max_cpu_loras", config.max_cpu_loras)
        if config.max_cpu_loras < config.max_loras:
            raise ValueError(f"max_cpu_loras ({config.max_cpu_loras}) must be >= max_loras ({config.max_loras}): "
                             "an adapter in a device slot is also kept in host memory")
    if config.lora_modules and not config.enable_lora:
        raise ValueError("lora_modules needs enable_lora; turn it on or drop the adapters")
    for name, path in (config.lora_modules or {}).items():
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError(f"lora_modules entry {name!r}={path!r}: expected NAME=PATH (a PEFT directory)")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def parse_size(value: int | str | None, what: str) -> int | None:
    """``"512MiB"``, ``"1GiB"``, ``"2e9"`` or an int -> bytes (None stays None)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{what}={value!r} is not a size; use bytes or a unit, e.g. 512MiB or 2GiB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
