"""Kernel launches per decoder layer in a decode step: the fused path launches about 10, not ~40.

A ``TorchDispatchMode`` sees every op the model dispatches. Ops that launch no kernel are not
counted: views (split, view, t, ...) and allocations (empty*); a may-alias op that did copy (a
dtype cast through ``to``, a ``reshape`` that could not view) is counted. A fused Triton kernel is one
``torch.ops.kvmesh.*`` op (the dispatch point's torch op), so it counts once whatever runs inside;
attention counts once too (its internals belong to the attention backend, which is being rewritten
as one kernel). The decode step runs through the ModelRunner's model as the engine runs it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.layers.custom_op import force_triton
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest
from kvmesh.replica.worker.input_batch import prepare_inputs
from kvmesh.replica.worker.model_runner import ModelRunner
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

ALLOCATIONS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
               "aten::new_empty_strided"}
GREEDY = SamplingParams(temperature=0.0)
MATMULS = {"aten::linear", "aten::mm", "aten::addmm"}  # one GEMM launch (CPU dispatches linear itself)
MAX_FUSED_PER_LAYER = 12


class LaunchCounter(TorchDispatchMode):
    """Per decoder layer, the names of the kernel-launching ops it dispatches (hooks live while entered)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.layers = model.model.layers
        self.per_layer: list[list[str]] = [[] for _ in self.layers]
        self.layer: int | None = None
        self.in_attention = False
        self.hooks = []

    def __enter__(self):
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn.attn
            self.hooks += [layer.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "layer", i)),
                           layer.register_forward_hook(lambda m, a, out: setattr(self, "layer", None)),
                           attn.register_forward_pre_hook(self._enter_attention),
                           attn.register_forward_hook(lambda m, a, out: setattr(self, "in_attention", False))]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)

    def _enter_attention(self, module, args) -> None:
        self.per_layer[self.layer].append("attention")
        self.in_attention = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket._qualified_op_name
        launched = name not in ALLOCATIONS and (not func.is_view or _copied(args[0], out))
        if self.layer is not None and not self.in_attention and launched:
            self.per_layer[self.layer].append("matmul" if name in MATMULS else name)
        return out


def _copied(source: torch.Tensor, out) -> bool:
    """Whether a may-alias op (``to``, ``reshape``) wrote new memory instead of returning a view."""
    first = out[0] if isinstance(out, (list, tuple)) else out
    return first.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()


def decode_step(path, dtype: str, fused: bool, device: torch.device):
    """(runner, inputs, attention metadata) of a decode step of 3 requests at positions 5, 3 and 7.
    Their prompts' K/V are not computed (the cache holds zeros): what the step launches does not
    depend on what the cache holds."""
    runner = ModelRunner(EngineConfig(model=str(path), dtype=dtype, device=str(device), kv_cache_memory=1 << 22,
                                      num_kv_blocks=16))
    force_triton(runner.model, fused)
    decode = [ScheduledRequest(f"r{i}", [3], computed, blocks, True, GREEDY)
              for i, (computed, blocks) in enumerate([(5, [1, 2]), (3, [3]), (7, [4, 5])])]
    inputs = prepare_inputs(decode, runner.block_size, runner.device)
    return runner, inputs, runner.attn_backend.build(inputs.common)


@torch.inference_mode()
def decode_launches(path, dtype: str, fused: bool, device: torch.device) -> list[list[str]]:
    """Per layer, the kernel launches of the decode step."""
    runner, inputs, metadata = decode_step(path, dtype, fused, device)
    with LaunchCounter(runner.model) as counter:
        runner.model(inputs.input_ids, inputs.positions, metadata)
    return counter.per_layer


@torch.inference_mode()
def profiled_layer_ops(path, dtype: str, fused: bool, device: torch.device, layer: int) -> list[str]:
    """The torch profiler's view of the same step: the top-level ops of decoder layer ``layer``
    (each under its own ``record_function``; attention is one ``record_function`` too)."""
    runner, inputs, metadata = decode_step(path, dtype, fused, device)
    target, attn = runner.model.model.layers[layer], runner.model.model.layers[layer].self_attn.attn
    scopes = {target: record_function("decoder_layer"), attn: record_function("attention")}
    def enter(module, args) -> None:
        scopes[module].__enter__()

    hooks = [h for m in scopes for h in (m.register_forward_pre_hook(enter),
                                         m.register_forward_hook(lambda m, a, o: scopes[m].__exit__(None, None, None)))]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.model(inputs.input_ids, inputs.positions, metadata)
    for h in hooks:
        h.remove()
    events = prof.events()
    scope_id = next(e.id for e in events if e.name == "decoder_layer")
    return [e.name if _launched(e) else "view" for e in events
            if e.cpu_parent is not None and e.cpu_parent.id == scope_id]


def _launched(event) -> bool:
    """Whether a profiled op launched work: not a view (view, split, t, ...), or a may-alias op that copied
    (``to`` casting, ``reshape`` cloning)."""
    if not event.name.startswith("aten::"):
        return True
    packet = getattr(torch.ops.aten, event.name.removeprefix("aten::"))
    is_view = all(getattr(packet, overload).is_view for overload in packet.overloads())
    return not is_view or any(c.name in ("aten::_to_copy", "aten::clone") for c in event.cpu_children)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_decode_step_launches_about_ten_kernels_per_layer(stories_path, triton_device, dtype):
    fused = decode_launches(stories_path, dtype, True, triton_device)
    reference = decode_launches(stories_path, dtype, False, triton_device)
    assert all(len(ops) == len(fused[1]) for ops in fused[1:]), fused
    assert len(fused[1]) <= MAX_FUSED_PER_LAYER, fused[1]
    assert len(fused[1]) < len(reference[1]), (fused[1], reference[1])
    # on CUDA the triton backend folds the rotary embedding into its cache write (inside "attention")
    rotary = {} if triton_device.type == "cuda" else {"kvmesh::rotary_embedding": 1}
    assert Counter(fused[1]) == Counter({
        "matmul": 4, "kvmesh::fused_add_rms_norm": 2, **rotary, "attention": 1, "kvmesh::silu_and_mul": 1})
    # layer 0 normalizes the embeddings without a residual: the same number of launches
    assert Counter(fused[0])["kvmesh::rms_norm"] == 1 and len(fused[0]) == len(fused[1])


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_the_torch_profiler_counts_the_same_launches_per_layer(stories_path, triton_device, fused):
    """Two ways of counting agree (bf16: the reference's dtype casts are launches, its views are not)."""
    profiled = profiled_layer_ops(stories_path, "bfloat16", fused, triton_device, layer=1)
    launching = ["matmul" if n in MATMULS else n for n in profiled if n != "view"]
    assert Counter(launching) == Counter(decode_launches(stories_path, "bfloat16", fused, triton_device)[1])


if __name__ == "__main__":  # the table of BENCHMARKS.md: python -m tests.replica.test_fused_launch_count [model]
    import os
    import sys

    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported (by the fused path)
    model = sys.argv[1] if len(sys.argv) > 1 else "../shared/models/stories260K/hf"
    for dtype in ("float32", "bfloat16"):
        for fused in (False, True):
            per_layer = decode_launches(model, dtype, fused, torch.device("cpu"))
            profiled = profiled_layer_ops(model, dtype, fused, torch.device("cpu"), layer=1)
            print(f"{dtype:9} {'fused' if fused else 'reference':9} per layer {[len(ops) for ops in per_layer]}  "
                  f"layer 1: {dict(Counter(per_layer[1]))}\n    profiler, layer 1: {len(profiled)} top-level ops, "
                  f"{sum(n != 'view' for n in profiled)} launching: {dict(Counter(profiled))}")
