"""Hugging Face ``generate`` on the same weights: the workload in static batches, and decode ms/step.

Static batches: requests in submission order, ``batch_size`` at a time, left-padded; each batch
generates its longest output for every row and only the tokens asked for count. Decode ms/step at
B sequences: the time between consecutive new tokens of one generate call (a streamer timestamps
each), after the prefill and the warm-up steps; the median.
"""

from __future__ import annotations

import statistics
import time

from kvmesh.cluster.measure.benchmarks.engine_speed.timing import Clock
from kvmesh.cluster.measure.benchmarks.engine_speed.workload import SpeedWorkload, make_workload

PAD_ID = 0


def load_hf_model(model_dir: str, dtype, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None  # generate exactly as many tokens as asked
    model.generation_config.pad_token_id = PAD_ID
    return model


def _generate(model, prompts: list[list[int]], new_tokens: int, device, streamer=None) -> None:
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts], device=device)  # [B, width]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, streamer=streamer)


def hf_workload(model, workload: SpeedWorkload, batch_size: int, device) -> dict:
    from tqdm import tqdm

    clock = Clock(device)
    steps = 0
    for start in tqdm(range(0, len(workload.prompts), batch_size), desc="hf generate: workload", leave=False):
        outs = workload.output_lens[start:start + batch_size]
        _generate(model, workload.prompts[start:start + batch_size], max(outs), device)
        steps += max(outs)
    times = clock.read()
    return {"batch_size": batch_size, "output_tokens": workload.output_tokens, "steps": steps, **times,
            "output_tok_per_s": workload.output_tokens / times["wall_s"],
            "total_tok_per_s": (workload.output_tokens + workload.prompt_tokens) / times["wall_s"],
            "cpu_ms_per_output_token": 1000 * times["cpu_s"] / workload.output_tokens,
            "wall_ms_per_step": 1000 * times["wall_s"] / steps}


class StepTimer:
    """A ``generate`` streamer that timestamps each ``put``: once for the prompt, then once per new token
    (after ``tokens.cpu()``, so the device has finished that step)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def put(self, value) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def end(self) -> None:
        pass

    def step_ms(self, skip: int) -> tuple[list[float], list[float]]:
        """ms of each decode step after the first ``skip`` (put 0 is the prompt, put 1 the prefill's token)."""
        first = 2 + skip
        return ([1000 * (b - a) for a, b in zip(self.wall[first - 1:], self.wall[first:], strict=False)],
                [1000 * (b - a) for a, b in zip(self.cpu[first - 1:], self.cpu[first:], strict=False)])


def hf_decode_ms(model, batch: int, context: int, warmup: int, steps: int, vocab_size: int, seed: int,
                 device) -> dict:
    """Median ms of one ``generate`` decode step at ``batch`` sequences of ``context`` prompt tokens."""
    import torch

    prompts = make_workload(f"hf-decode-{seed}", batch, (context, context), (1, 1), vocab_size).prompts
    timer = StepTimer()
    try:
        _generate(model, prompts, 1 + warmup + steps, device, streamer=timer)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"running_seqs": batch, "context_tokens": context, "skipped": "out of device memory"}
    wall, cpu = timer.step_ms(warmup)
    return {"running_seqs": batch, "context_tokens": context, "steps": len(wall),
            "wall_ms_per_step": statistics.median(wall), "cpu_ms_per_step": statistics.median(cpu)}
