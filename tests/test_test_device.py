"""The suite's device switch: KVMESH_TEST_DEVICE picks where engines run, and a typo is a clear error."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from .conftest import chosen_test_device, pytest_configure


@pytest.mark.parametrize("value, choice", [(None, "auto"), ("", "auto"), ("CPU", "cpu"), (" cuda ", "cuda")])
def test_the_choice_reads_the_environment(monkeypatch, value, choice):
    if value is None:
        monkeypatch.delenv("KVMESH_TEST_DEVICE", raising=False)
    else:
        monkeypatch.setenv("KVMESH_TEST_DEVICE", value)
    assert chosen_test_device() == choice


def test_an_unknown_device_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("KVMESH_TEST_DEVICE", "gpu0")
    with pytest.raises(pytest.UsageError, match="KVMESH_TEST_DEVICE='gpu0': use one of auto, cpu, cuda"):
        chosen_test_device()


def session_config() -> SimpleNamespace:
    """What pytest_configure touches of a session's config: its stash and the plugins it registers."""
    registered: dict = {}
    plugins = SimpleNamespace(register=lambda plugin, name: registered.update({name: plugin}))
    return SimpleNamespace(stash={}, pluginmanager=plugins)


def test_cpu_hides_the_gpus_from_the_session(monkeypatch):
    monkeypatch.setenv("KVMESH_TEST_DEVICE", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    pytest_configure(session_config())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("KVMESH_TEST_DEVICE", "auto")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    pytest_configure(session_config())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
