"""Step inputs go through buffers allocated once: host staging + persistent device twins (cpu_gpu_buffer.py)."""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.utils.cpu_gpu_buffer import CpuGpuBuffer, HostCopies

from .fake_device_runs import run_in_child

CPU = torch.device("cpu")


def storage(t: torch.Tensor) -> int:
    return getattr(t, "elem", t).untyped_storage().data_ptr()


def test_on_a_cpu_device_host_and_device_are_one_tensor_and_nothing_is_copied():
    buf = CpuGpuBuffer(8, torch.int64, CPU)
    assert buf.gpu is buf.cpu and not buf.cpu.is_pinned()
    buf.np[:3] = [4, 5, 6]
    staged = buf.copy_to_gpu(3)
    assert staged.tolist() == [4, 5, 6] and storage(staged) == storage(buf.cpu)
    sampled = torch.tensor([1, 2])
    assert HostCopies(4, torch.int64, CPU).start(sampled) == (sampled, None)


def test_a_buffer_grows_when_a_step_outgrows_it():
    buf = CpuGpuBuffer(2, torch.int32, CPU)
    buf.fit(5)
    assert buf.cpu.shape[0] >= 5 and buf.np.shape == buf.cpu.shape


def test_step_tensors_live_in_the_same_device_buffers_every_step(stories_path):
    """Two steps' inputs are views of one device buffer (what CUDA graphs want), filled by one
    non-blocking copy per step; a step larger than the buffer still gets correct inputs; small uploads do
    not block. (On the stand-in device, in a child process: fake_device_runs.py.)"""
    run = run_in_child("step_buffers", stories_path)
    assert run["same_buffers"] == [True, True]
    assert run["second"] == [[42], [3]]
    assert len(run["h2d"]) == 1 and "non_blocking=True" in run["h2d"][0]
    assert run["big"] == [list(range(1, 11)), list(range(10)),
                          [8 * 4 + i for i in range(4)] + [9 * 4 + i for i in range(4)] + [5 * 4, 5 * 4 + 1]]
    assert run["small"] == [True, [3, 1, 2]]
    assert len(run["small_h2d"]) == 1 and "non_blocking=True" in run["small_h2d"][0]


def test_sampled_ids_come_back_into_host_buffers_allocated_once(stories_path):
    """On the stand-in device every step's copy back lands in one of three host buffers made with the
    runner, in turn, and each step still reads its own tokens (fake_device_runs.py, a child process)."""
    run = run_in_child("token_copies", stories_path)
    assert run["storages"] == run["ring"][: len(run["storages"])] and len(set(run["storages"])) == 3
    assert run["tokens"] == run["cpu_tokens"]


@pytest.mark.gpu
def test_on_cuda_the_host_side_is_pinned():
    buf = CpuGpuBuffer(8, torch.int64, torch.device("cuda"))
    assert buf.cpu.is_pinned() and buf.gpu.is_cuda
    buf.np[:2] = [7, 8]
    assert buf.copy_to_gpu(2).tolist() == [7, 8]
    copies = HostCopies(4, torch.int64, torch.device("cuda"))
    host, event = copies.start(torch.tensor([5, 6], device="cuda"))
    event.synchronize()
    assert host.is_pinned() and host.tolist() == [5, 6]
