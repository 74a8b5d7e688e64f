"""The model runner: owns the model, the paged KV cache and the sampler of one rank.

``execute_model(SchedulerOutput)`` turns the scheduler's decision into tensors, runs the forward pass
(writing the step's K/V into the cache), computes logits only for the rows that sample and returns
``{request_id: token}`` (a ``ModelRunnerOutput`` with logprobs, prompt logprobs (prompt_logprobs.py) or the
target's tokens at draft positions (spec_decode/verify.py) when a step has them). Per-request state lives in
the persistent batch (input_batch.py). With ``cuda_graphs``, decode-only steps replay captured graphs
(cuda_graph.py). Device facts (memory for KV sizing, a rank's CUDA device) come through seams tested on CPU.
"""

from __future__ import annotations

import logging
import threading

import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.attention.kv_quant import kv_cache_torch_dtype
from kvmesh.replica.distributed.parallel_state import ParallelState
from kvmesh.replica.kv_layout import block_layout, symbolic_layout
from kvmesh.replica.model_config import eos_token_ids, load_hf_config, resolve_dtype, spec_from_hf_config
from kvmesh.replica.sample.grammar_mask import grammar_rows
from kvmesh.replica.sample.logprobs import LogprobsTensors, to_host
from kvmesh.replica.sample.prompt_logprobs import PendingPromptLogprobs, PromptLogprobsProcessor
from kvmesh.replica.sample.sampler import Sampler
from kvmesh.replica.serving.sampling_params import MAX_LOGPROBS
from kvmesh.replica.spec_decode.verify import SpecVerifier
from kvmesh.replica.step.scheduler_output import GrammarBitmask, SchedulerOutput
from kvmesh.replica.utils.cpu_gpu_buffer import HostCopies
from kvmesh.replica.worker.async_output import AsyncModelRunnerOutput
from kvmesh.replica.worker.device import pick_device, set_current_device, set_num_threads
from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode, use_cuda_graphs
from kvmesh.replica.worker.graphs.dispatcher import CudagraphDispatcher
from kvmesh.replica.worker.input_batch import InputBatch, ModelInputs
from kvmesh.replica.worker.kernel_warmup import warm_up_kernels
from kvmesh.replica.worker.kv_cache import (
    allocate_kv_cache,
    bytes_per_block,
    kv_cache_budget,
    log_capacity,
    module_bytes,
    num_blocks_for_budget,
    outside_memory_in_use,
    read_cuda_memory,
)
from kvmesh.replica.worker.kv_offload import make_kv_offload
from kvmesh.replica.worker.kv_scales import attach_kv_scales, kv_scales_digest
from kvmesh.replica.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
from kvmesh.replica.worker.profile_run import profile_forward
from kvmesh.replica.worker.weights import build_model, checkpoint_dir

logger = logging.getLogger(__name__)


class ModelRunner(LoRAModelRunnerMixin):
    # the device facts of KV sizing, behind two seams (CPU tests inject their own)
    read_device_memory = staticmethod(read_cuda_memory)
    reset_peak_memory = staticmethod(torch.cuda.reset_peak_memory_stats)

    def __init__(self, config, rank: int = 0, world_size: int = 1, parallel: ParallelState | None = None) -> None:
        self.config = config
        self.parallel = parallel or ParallelState(rank, world_size)
        self.device = pick_device(config.device, rank)
        self.hf_config = load_hf_config(config.model, config.hf_config, config.hf_overrides)
        self.spec = spec_from_hf_config(self.hf_config)
        set_num_threads(self.device, world_size, self.spec.hidden_size)
        self.dtype = resolve_dtype(config.dtype, self.spec, self.device)
        self.kv_cache_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, self.dtype)  # FP8: attention/kv_quant.py
        self.max_model_len = config.max_model_len or self.spec.max_position_embeddings
        self.vocab_size = self.spec.vocab_size
        self.block_size, self.eos_token_ids = config.block_size, eos_token_ids(config.model, self.spec.eos_token_ids)
        if self.spec.sliding_window and self.spec.sliding_window < self.max_model_len:
            logger.warning("model declares sliding_window=%d; attention here is full (exact up to the window)",
                           self.spec.sliding_window)
        self.outside_memory_at_start = outside_memory_in_use(self.device)  # replicas sharing the card hold it
        self.model = self._build_model()
        self.load_lora_model(self.model, self.spec, config, self.device, self.dtype)  # before any capture
        self.attn_backend = get_attn_backend(config.attention_backend, self.device, self.dtype, self.block_size,
                                             self.kv_cache_dtype)
        for attn in self.model.attention_layers():
            attn.backend = self.attn_backend
        attach_kv_scales(self.model.attention_layers(), self.kv_cache_dtype, checkpoint_dir(config), self.device)
        self.input_batch = InputBatch(config.max_num_seqs, -(-self.max_model_len // self.block_size) + 1,
                                      self.block_size, self.device, config.max_num_batched_tokens, config.seed)
        self.input_batch.loras.manager = self.lora
        self.static_decode = None  # decode steps on static shapes (CUDA graphs)
        # measured before the KV cache is sized, captured by bind_thread on the thread that replays them
        self.capture_graphs = use_cuda_graphs(config.cuda_graphs, self.device, self.attn_backend, self.block_size,
                                              self.parallel.tp_size)
        if self.capture_graphs:
            self.static_decode = StaticDecode(self.model, self.attn_backend, config.max_num_seqs,
                                              self.input_batch.block_tables.table.shape[1], self.block_size,
                                              self.device, self.max_model_len)
        self._bound_thread: int | None = None  # the thread that steps (bind_thread)
        self._allocate_kv_cache()
        logger.info("attention backend %s, block_size %d, %s", self.attn_backend.name, self.block_size,
                    f"CUDA graphs for decode batch sizes {self.static_decode.sizes}" if self.static_decode
                    else "no CUDA graphs")
        warm_up_kernels(self)  # every Triton specialization a step can hit, compiled before the replica is ready
        # packed logprobs of a step: [N, 2 (1 + MAX_LOGPROBS) + 1] float64, back without blocking
        logprobs_copies = HostCopies(config.max_num_seqs * (2 * MAX_LOGPROBS + 3), torch.float64, self.device)
        self.sampler = Sampler(logprobs_copies=logprobs_copies)  # random rows draw from keys (sample/draws.py)
        self.verify = SpecVerifier(config.seed)  # drafts checked against this step's logits (spec_decode/)
        self.token_copies = HostCopies(config.max_num_seqs, torch.int64, self.device)  # sampled ids come back here
        # rows waiting between a prompt's prefill chunks; a step's entries come back in one copy
        self.prompt_logprobs = PromptLogprobsProcessor(config.max_num_batched_tokens + config.max_num_seqs,
                                                       self.device)

    def _allocate_kv_cache(self) -> None:
        """The KV cache sized from the memory budget, bound to each attention layer, its layout and the host tier."""
        self.num_kv_blocks = self._size_kv_cache()
        layers = self.model.attention_layers()
        attn0 = layers[0]
        # [num_layers, *layer_shape], e.g. torch: [num_layers, 2, num_kv_heads, num_blocks, block_size, head_dim]
        self.kv_cache = allocate_kv_cache(self.spec.num_hidden_layers, self._layer_shape(self.num_kv_blocks),
                                          self.kv_cache_dtype, self.device)
        for i, attn in enumerate(layers):
            attn.kv_cache = self.kv_cache[i]
        # where each block lies, computed once here: the host tier, the KV transfer agent and /load read it
        self.kv_layout = block_layout(self.kv_cache, symbolic_layout(self.attn_backend.kv_cache_shape),
                                      self.block_size, attn0.num_kv_heads, attn0.head_dim, kv_scales_digest(layers))
        self.kv_offload = make_kv_offload(self.config.kv_offload_memory, self.kv_cache, self.kv_layout)  # None: none
        self.num_host_blocks = 0 if self.kv_offload is None else self.kv_offload.num_host_blocks

    def _build_model(self) -> torch.nn.Module:
        load_format = "safetensors" if checkpoint_dir(self.config) is not None else "dummy"
        return build_model(self.spec, self.max_model_len, self.dtype, self.device, self.config.model, load_format,
                           self.config.seed, self.parallel)

    def _size_kv_cache(self) -> int:
        attn0 = self.model.attention_layers()[0]
        block_bytes = bytes_per_block(self.spec.num_hidden_layers, self.block_size, attn0.num_kv_heads,
                                      attn0.head_dim, self.kv_cache_dtype)
        if self.device.type == "cuda":  # kv_cache_memory, when set, caps the profiled budget
            cap = None if self.config.kv_cache_memory is None else self.config.kv_cache_memory // self.parallel.tp_size
            budget = self.profiled_kv_budget(cap)
        else:
            budget = self.config.resolved_kv_cache_memory // self.parallel.tp_size
        num_blocks = num_blocks_for_budget(budget, block_bytes, self.block_size, self.max_model_len)
        if self.config.num_kv_blocks is not None:
            num_blocks = min(num_blocks, self.config.num_kv_blocks)
        num_blocks = self.parallel.all_reduce_min_int(num_blocks)
        log_capacity(num_blocks, self.block_size, self.max_model_len, block_bytes)
        return num_blocks

    @property
    def static_decode(self) -> StaticDecode | None:
        return self._static_decode

    @static_decode.setter
    def static_decode(self, static: StaticDecode | None) -> None:
        """Decode-only steps stage their inputs into the graphs' own (the input batch is told)."""
        self._static_decode = static
        self.input_batch.dispatcher = CudagraphDispatcher(static)

    def _layer_shape(self, num_blocks: int) -> tuple[int, ...]:
        attn0 = self.model.attention_layers()[0]
        return self.attn_backend.kv_cache_shape(num_blocks, self.block_size, attn0.num_kv_heads, attn0.head_dim)

    def bind_thread(self) -> None:
        """Make the calling thread the one that steps: its current CUDA device becomes the runner's, and the
        decode graphs are captured here, where they replay (the engine thread calls this before its first
        step; a step on another thread rebinds)."""
        set_current_device(self.device)
        if self.capture_graphs and not self.static_decode.graphs:
            self.static_decode.capture()
        self._bound_thread = threading.get_ident()

    @property
    def host_kv_cache(self) -> torch.Tensor | None:
        """The host tier's tensor, [num_host_blocks, *one device block] (None without a tier)."""
        return None if self.kv_offload is None else self.kv_offload.host

    def finished_offload_stores(self) -> list[int]:
        """Steps whose copies to the host tier landed since the last call (never blocks)."""
        return [] if self.kv_offload is None else self.kv_offload.finished()

    def profiled_kv_budget(self, cap: int | None = None) -> int:
        """Bytes for the KV cache on a GPU: read the facts, reset the peak counter, run the profiling forward,
        read them again, measure the decode graphs (with CUDA graphs) and take what ``gpu_memory_utilization``
        leaves this engine, at most ``cap`` (the device facts come from ``read_device_memory``)."""
        before = self.read_device_memory(self.device)
        self.reset_peak_memory(self.device)
        self.profile_run()
        after = self.read_device_memory(self.device)
        graphs = 0 if not self.capture_graphs else self.static_decode.measure_capture(
            self.model.attention_layers(), self._layer_shape(1), self.kv_cache_dtype, self.read_device_memory)
        return kv_cache_budget(before, after, module_bytes(self.model), self.config.gpu_memory_utilization, cap,
                               self.outside_memory_at_start, graphs)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward over a full token budget of fresh prefills (no KV cache), to measure peak memory."""
        profile_forward(self.model, self.attn_backend, self.config, self.max_model_len, self.block_size, self.device)

    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns the sampled token of every scheduled request with ``sample=True`` (a
        ``ModelRunnerOutput`` carrying logprobs too when a request asked for them)."""
        return self.execute_model_async(out).get()

    @torch.inference_mode()
    def execute_model_async(self, out: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Launch one step without waiting for it: ``.get()`` of the result returns what ``execute_model``
        does. Decode rows sampled by the previous launch read their input ids from its sampled tensor."""
        if self._bound_thread != threading.get_ident():
            self.bind_thread()
        if out.finished_request_ids:
            self.input_batch.free(out.finished_request_ids)
            self.prompt_logprobs.free(out.finished_request_ids)
        if out.is_empty:
            return AsyncModelRunnerOutput.ready({})
        copies = out.offload_copies
        if copies is not None:
            self.kv_offload.load(copies.loads)  # the prefixes this step's prefills read
        asks_prompt_logprobs = any(sr.sampling_params.prompt_logprobs is not None for sr in out.scheduled)
        drafted = any(sr.spec_token_ids for sr in out.scheduled)  # drafts and prompt logprobs read the eager hidden
        inputs = self.input_batch.prepare(out, static=not asks_prompt_logprobs and not drafted)
        graph_tokens = graph_logprobs = None  # [N] the graph's argmax or draw, [N, W] its packed logprobs (or None)
        if inputs.static_size is not None:  # its inputs (and sampling settings) are already the graph's
            logits, graph_tokens, graph_logprobs = self.static_decode.run(inputs.common.num_reqs, inputs.graph_sampling)
        elif inputs.prefill_size is not None:  # a short one-request prefill, staged the same way
            logits, graph_tokens, graph_logprobs = self.static_decode.prefill.run(inputs.prefill_size,
                                                                                  inputs.graph_sampling)
        else:
            with self.lora_mapping(inputs.lora_mapping):  # which slot each request's tokens use; hidden: [T, H]
                hidden = self.model(inputs.input_ids, inputs.positions, self.attn_backend.build(inputs.common))
        if copies is not None:
            self.kv_offload.store(copies.job_id, copies.stores)  # the blocks this step completed
        prompt_logprobs = self._prompt_logprobs(out, inputs, hidden) if asks_prompt_logprobs else None
        targets = self.verify(out, lambda ids: self.input_batch.first_token_index(inputs, ids), hidden,
                              self.model.compute_logits) if drafted else None
        if not inputs.sample_request_ids:  # nothing sampled; prompt logprobs are read when the output is
            return AsyncModelRunnerOutput.prompt_logprobs_only(prompt_logprobs) if prompt_logprobs else \
                AsyncModelRunnerOutput.ready({})
        if inputs.static_size is None and inputs.prefill_size is None:
            if len(inputs.sample_rows) < hidden.shape[0]:  # else every token samples: rows are already in order
                hidden = hidden[inputs.logits_indices]
            logits = self.model.compute_logits(hidden)  # [N, V]
        # the graph's argmax or draw is the answer (nothing launches after it), else the eager sampler's
        tokens, logprobs = (graph_tokens, None) if inputs.graph_answers else \
            self._sample(logits, inputs, out.grammar_bitmask)
        if graph_logprobs is not None:  # the tokens ride in its column 0: one copy back for both
            logprobs = to_host(graph_logprobs, None, self.sampler.logprobs_copies)
        self.input_batch.count_samples(inputs.sample_rows, tokens)
        return AsyncModelRunnerOutput(self.input_batch, inputs.sample_request_ids, inputs.sample_rows, tokens,
                                      self.token_copies, logprobs, prompt_logprobs, graph_logprobs is not None,
                                      targets)

    def _sample(self, logits: torch.Tensor, inputs: ModelInputs, grammar: GrammarBitmask | None = None
                ) -> tuple[torch.Tensor, LogprobsTensors | None]:
        """The eager sampler on ``logits`` [N, V]: tokens [N] and the logprobs rows asked for (or None); the rows of
        ``grammar`` (structured outputs) sample only what their bitmask allows."""
        sampling = self.input_batch.sampling_metadata(inputs.sample_rows, self.vocab_size, self.eos_token_ids)
        if grammar is not None:  # such rows are never plain greedy: ``sampling`` is this step's own
            sampling.grammar = grammar_rows(grammar, inputs.sample_request_ids, logits.device)
        if sampling.max_num_logprobs is None:  # the common case: no row asks for logprobs
            return self.sampler(logits, sampling), None
        return self.sampler.sample_with_logprobs(logits, sampling)

    def _prompt_logprobs(self, out: SchedulerOutput, inputs: ModelInputs, hidden: torch.Tensor
                         ) -> PendingPromptLogprobs | None:
        """Prompt logprobs of this step's prefill chunks (``hidden`` [T, H]) on their way to the host (None: none
        this step). Only full requests without output ask: a request decoding by id has its prompt done."""
        asking = [sr for sr in out.scheduled
                  if sr.sampling_params.prompt_logprobs is not None and not sr.output_token_ids]
        if not asking:
            return None
        first_rows = self.input_batch.first_token_index(inputs, [sr.request_id for sr in asking])
        return self.prompt_logprobs.compute(asking, first_rows, hidden, self.model.compute_logits)

    # -- the rest of ModelRunnerInterface (its LoRA part: the mixin): one process, no TP group that could break --
    dead_reason: str | None = None

    def check_health(self, timeout_s: float = 10.0) -> str | None:
        return self.dead_reason

    def shutdown(self) -> None:
        """Nothing to release by hand: the model and KV cache go with the runner."""

