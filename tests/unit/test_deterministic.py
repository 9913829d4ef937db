"""runtime.deterministic: on a host training on a GPU, CUDA's deterministic settings (torch's
deterministic algorithms, cuDNN without autotuning, cuBLAS's fixed workspace); on the CPU,
nothing changes. The settings are process-wide, so each test puts them back."""

from __future__ import annotations

import os

import pytest
import torch

from raymtl.runtime.hosts.compute import CUBLAS_WORKSPACE, deterministic


@pytest.fixture
def settings_restored(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:4]
    torch.utils.deterministic.fill_uninitialized_memory = before[4]


def test_a_gpu_host_turns_cudas_deterministic_settings_on(settings_restored):
    deterministic(True, "cuda")
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # an op without one warns
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE == ":4096:8"
    assert not torch.utils.deterministic.fill_uninitialized_memory  # no cost on every empty


def test_off_a_gpu_host_lets_cudnn_autotune(settings_restored):
    deterministic(False, "cuda")
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_a_cpu_host_changes_nothing(settings_restored):
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    deterministic(True, "cpu")
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
