"""Step inputs go through buffers allocated once: host staging + persistent device twins (cpu_gpu_buffer.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kvmesh.replica.cpu_gpu_buffer import CpuGpuBuffer, to_device
from kvmesh.replica.input_batch import InputBatch
from kvmesh.replica.sampling_params import SamplingParams
from kvmesh.replica.scheduler_output import ScheduledRequest, SchedulerOutput

from .fake_device import FAKE, FakeDevice

CPU = torch.device("cpu")
SP = SamplingParams(temperature=0.0)


def storage(t: torch.Tensor) -> int:
    return getattr(t, "elem", t).untyped_storage().data_ptr()


def test_on_a_cpu_device_host_and_device_are_one_tensor_and_nothing_is_copied():
    buf = CpuGpuBuffer(8, torch.int64, CPU)
    assert buf.gpu is buf.cpu and not buf.cpu.is_pinned()
    buf.np[:3] = [4, 5, 6]
    staged = buf.copy_to_gpu(3)
    assert staged.tolist() == [4, 5, 6] and storage(staged) == storage(buf.cpu)
    sampled = torch.tensor([1, 2])
    assert buf.copy_to_cpu(sampled) is sampled


def test_a_buffer_grows_when_a_step_outgrows_it():
    buf = CpuGpuBuffer(2, torch.int32, CPU)
    buf.fit(5)
    assert buf.cpu.shape[0] >= 5 and buf.np.shape == buf.cpu.shape


def test_step_tensors_live_in_the_same_device_buffers_every_step():
    """Two steps' inputs are views of one set of device buffers (what CUDA graphs want), filled by
    non-blocking copies; a step larger than the buffers still gets correct inputs."""
    with FakeDevice() as dev:
        batch = InputBatch(4, 4, 4, FAKE, max_num_tokens=4)
        bufs = batch.buffers
        with dev.window() as log:
            first = batch.prepare(SchedulerOutput([ScheduledRequest("a", [10, 11, 12], 0, [7], True, SP)], 3))
        batch.record_samples(first.sample_rows, np.array([42]))
        second = batch.prepare(SchedulerOutput([], 1, decode_request_ids=["a"]))
        for inputs in (first, second):
            assert storage(inputs.input_ids) == storage(bufs.input_ids.gpu)
            assert storage(inputs.common.block_tables) == storage(bufs.block_tables.gpu)
        assert second.input_ids.tolist() == [42] and second.positions.tolist() == [3]
        assert len(log.h2d) == 7 and all("non_blocking=True" in h for h in log.h2d)
        big = batch.prepare(SchedulerOutput([ScheduledRequest("b", list(range(1, 11)), 0, [8, 9, 5], True, SP)], 10))
        assert big.input_ids.tolist() == list(range(1, 11)) and big.positions.tolist() == list(range(10))
        assert big.common.slot_mapping.tolist() == [8 * 4 + i for i in range(4)] + [9 * 4 + i for i in range(4)] + [
            5 * 4, 5 * 4 + 1]


def test_small_uploads_do_not_block():
    with FakeDevice() as dev:
        with dev.window() as log:
            t = to_device([3, 1, 2], torch.int64, FAKE)
        assert t.device == FAKE and t.tolist() == [3, 1, 2]
    assert len(log.h2d) == 1 and "non_blocking=True" in log.h2d[0]


@pytest.mark.gpu
def test_on_cuda_the_host_side_is_pinned():
    buf = CpuGpuBuffer(8, torch.int64, torch.device("cuda"))
    assert buf.cpu.is_pinned() and buf.gpu.is_cuda
    buf.np[:2] = [7, 8]
    assert buf.copy_to_gpu(2).tolist() == [7, 8]
    assert buf.copy_to_cpu(torch.tensor([5, 6], device="cuda")).tolist() == [5, 6]
