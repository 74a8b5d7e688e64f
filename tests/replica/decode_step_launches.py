"""What one real decode step launches, kernel by kernel and phase by phase (the engine's own step).

An engine on stories260K with the Triton attention backend and the fused Triton layers (the CUDA
path; on CPU the kernels run through Triton's interpreter) prefills B requests, then its next step --
B decode rows -- is watched two ways at once:

    aten ops     a ``TorchDispatchMode`` sees every op dispatched outside a Triton wrapper; views and
                 allocations launch nothing and are not counted (a may-alias op that copied is)
    Triton       the kernel class's ``run`` (the launch path, compiled or interpreted) is wrapped, so
                 every launch counts by kernel name, the ``torch.ops.kvmesh.*`` wrappers not at all

(the interpreter's own tensor copies inside a launch are not counted) and each launch is put in the phase it happened
in: ``inputs`` (the persistent batch writes and uploads
the step), ``layer`` (inside a decoder layer: counted per layer), ``model`` (embedding, final norm),
``lm_head``, ``sample``, ``runner`` (the rest of ``execute_model``) and ``output`` (reading the tokens
back). On CPU the greedy argmax runs in numpy (sampler.argmax), unseen here; on CUDA it is one
``aten::argmax`` in ``sample``. tests/replica/test_decode_step_launches.py checks it; ``python
tests/replica/decode_step_launches.py
[model]`` prints the BENCHMARKS.md table (``--prefill``: the cached-prefix step's, eager and on the prefill
graphs' path), split-KV sized for an H100 (TRITON_INTERPRET=1 is set here
before triton is imported).
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import torch
from kvmesh.replica.engine.engine_request import EngineRequest
from torch.utils._python_dispatch import TorchDispatchMode

ALLOCATIONS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
               "aten::new_empty_strided", "aten::zeros_like", "aten::lift_fresh"}
MATMULS = {"aten::linear", "aten::mm", "aten::addmm"}
PROMPT = [1, 403, 407, 261, 378, 445, 263, 265, 281, 398, 284, 425]


class StepLaunches(TorchDispatchMode):
    """Launches of one step: ``phases[phase]`` a Counter of kernel names, ``per_layer`` one per layer."""

    def __init__(self, runner) -> None:
        super().__init__()
        self.runner = runner
        self.phase = "runner"
        self.phases: dict[str, Counter] = {}
        self.per_layer: list[Counter] = [Counter() for _ in runner.model.model.layers]
        self.layer: int | None = None
        self.in_kernel = False  # inside a Triton launch: the interpreter's own tensor copies are not launches
        self._undo = []

    def record(self, name: str) -> None:
        if self.layer is not None:
            self.per_layer[self.layer][name] += 1
        phase = "layer" if self.layer is not None else self.phase
        self.phases.setdefault(phase, Counter())[name] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket._qualified_op_name
        if name.startswith("kvmesh::") or self.in_kernel:  # Triton: counted where the kernel launches
            return out
        if name not in ALLOCATIONS and (not func.is_view or _copied(args[0], out)):
            self.record("matmul" if name in MATMULS else name)
        return out

    def __enter__(self):
        from kvmesh.replica.worker.async_output import AsyncModelRunnerOutput

        self._patch_triton_launches()
        self._phase(AsyncModelRunnerOutput, "get", "output")
        self._phase(self.runner.input_batch, "prepare", "inputs")
        self._phase(self.runner.model, "compute_logits", "lm_head")
        self._phase(self.runner, "sampler", "sample")
        model_forward = self.runner.model.forward
        self._phase(self.runner.model, "forward", "model", model_forward)
        for i, layer in enumerate(self.runner.model.model.layers):
            self._undo += [layer.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "layer", i)).remove,
                           layer.register_forward_hook(lambda m, a, o: setattr(self, "layer", None)).remove]
        return super().__enter__()

    def __exit__(self, *exc):
        for undo in reversed(self._undo):
            undo()
        return super().__exit__(*exc)

    def _phase(self, owner, attr: str, phase: str, fn=None) -> None:
        """Calls of ``owner.attr`` run in ``phase`` (an instance attribute or a class's method)."""
        had, original = attr in vars(owner), vars(owner).get(attr)
        fn = fn or getattr(owner, attr)

        def wrapped(*args, **kwargs):
            before, self.phase = self.phase, phase
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase = before

        setattr(owner, attr, wrapped)
        self._undo.append(lambda: setattr(owner, attr, original) if had else delattr(owner, attr))

    def _patch_triton_launches(self) -> None:
        from kvmesh.replica.attention import triton_paged_attention as tpa

        kernel_class = type(tpa._unified_attention_kernel)  # JITFunction, or InterpretedFunction on CPU
        run = kernel_class.run

        def counted(kernel, *args, **kwargs):
            self.record(f"triton:{kernel.fn.__name__}")
            self.in_kernel = True
            try:
                return run(kernel, *args, **kwargs)
            finally:
                self.in_kernel = False

        kernel_class.run = counted
        self._undo.append(lambda: setattr(kernel_class, "run", run))


def _copied(source, out) -> bool:
    first = out[0] if isinstance(out, (list, tuple)) else out
    return first.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()


def engine(path: str, batch: int):
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.layers.custom_op import force_triton
    from kvmesh.replica.serving.sampling_params import SamplingParams

    config = EngineConfig(model=path, dtype="bfloat16", device="cpu", attention_backend="triton", block_size=16,
                          kv_cache_memory=64 << 20, max_num_seqs=batch,
                          max_num_batched_tokens=max(2048, batch * len(PROMPT)))
    llm = LLMEngine(config)
    force_triton(llm.model_runner.model, True)
    for i in range(batch):
        llm.add_request(EngineRequest(f"r{i}", PROMPT[: 4 + i % 8], SamplingParams(temperature=0.0, max_tokens=8)))
    llm.step()  # the prefills; every request has sampled its first token
    return llm


@torch.inference_mode()
def decode_step_launches(path: str, batch: int) -> StepLaunches:
    llm = engine(path, batch)
    with StepLaunches(llm.model_runner) as launches:
        outputs = llm.step()
    assert len(outputs) == batch and all(len(o.new_token_ids) == 1 for o in outputs), outputs
    return launches


@torch.inference_mode()
def cached_prefix_launches(path: str, static: bool) -> tuple[StepLaunches, list]:
    """The step of 5 tokens over a 2-block cached prefix, one request (the cached-prefix TTFT step): eager, or
    with ``static`` on the prefill graphs' path (prefill_graph.py; on CPU its padded forward runs eagerly,
    so the count is what the graph holds). Returns the launches and the prefill sizes the step ran at."""
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode

    llm = engine(path, 1)
    while llm.has_unfinished_requests():
        llm.step()
    runner, staged = llm.model_runner, []
    if static:
        runner.static_decode = StaticDecode(runner.model, runner.attn_backend, 1,
                                            runner.input_batch.block_tables.table.shape[1], 16, runner.device,
                                            runner.max_model_len)
        run = runner.static_decode.prefill.run
        runner.static_decode.prefill.run = lambda size, sampling=None: staged.append(size) or run(size, sampling)
    prefix = (PROMPT * 3)[:32]
    llm.add_request(EngineRequest("fill", prefix + [7], SamplingParams(temperature=0.0, max_tokens=1)))
    while llm.has_unfinished_requests():
        llm.step()
    staged.clear()
    llm.add_request(EngineRequest("hit", prefix + [9, 8, 7, 6, 5], SamplingParams(temperature=0.0, max_tokens=1)))
    with StepLaunches(runner) as launches:
        outputs = llm.step()
    assert len(outputs) == 1 and len(outputs[0].new_token_ids) == 1, outputs
    return launches, staged


def _rows(c, label, tag: str, *extra) -> list[str]:
    """One markdown row of ``c``'s counts (label, per decoder layer, each phase, step total, Triton launches,
    ``extra`` columns) and HTML comments with each phase's ops, tagged ``tag``."""
    total = sum(sum(p.values()) for p in c.phases.values())
    triton = sum(n for p in c.phases.values() for k, n in p.items() if k.startswith("triton:"))
    n = [sum(c.phases.get(phase, Counter()).values()) for phase in
         ("model", "lm_head", "sample", "inputs", "runner", "output")]
    cells = [label, sum(c.per_layer[1].values()), *n, total, triton, *extra]
    lines = ["| " + " | ".join(map(str, cells)) + " |"]
    lines += [f"<!-- {tag} {phase}: {dict(counts)} -->" for phase, counts in c.phases.items() if phase != "layer"]
    return lines + [f"<!-- {tag} layer 1: {dict(c.per_layer[1])} -->"]


def prefill_table(path: str) -> str:
    """The BENCHMARKS.md rows of the cached-prefix step, split-KV sized for an H100 (132 SMs)."""
    from kvmesh.replica.attention import triton_paged_attention as tpa

    tpa.num_sms = lambda device: 132
    lines = ["| path | per decoder layer | embed + final norm | LM head | sampling | inputs | runner | output | "
             "total | Triton launches | prefill graph size |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for static in (False, True):
        c, staged = cached_prefix_launches(path, static)
        lines += _rows(c, "graph" if static else "eager", f"{static=}", staged)
    return "\n".join(lines)


def table(path: str) -> str:
    """The BENCHMARKS.md rows, split-KV sized for an H100 (132 SMs) as on the GPU: batch 1 splits 32 ways."""
    from kvmesh.replica.attention import triton_paged_attention as tpa

    tpa.num_sms = lambda device: 132
    lines = ["| batch | per decoder layer | embed + final norm | LM head | sampling | inputs | runner | output | "
             "step total | Triton launches |", "|---|---|---|---|---|---|---|---|---|---|"]
    for batch in (1, 256):
        lines += _rows(decode_step_launches(path, batch), batch, f"B={batch}")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    args = [a for a in sys.argv[1:] if a != "--prefill"]
    model = args[0] if args else "../shared/models/stories260K/hf"
    print(prefill_table(model) if "--prefill" in sys.argv else table(model))
