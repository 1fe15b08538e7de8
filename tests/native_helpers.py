"""Shared by several test modules (moved out of tests/test_native.py, which uses them too): path, q8_reference, rel, threads."""
import pytest
import torch
from engine import native


PATHS = [0, 1, 2]


@pytest.fixture(params=PATHS, ids=["c", "avx2", "avx512"])
def path(request, monkeypatch):
    active = native.lib().mdk_select_path(-1)
    if request.param > native.lib().mdk_select_path(request.param):
        native.lib().mdk_select_path(active)
        pytest.skip("this CPU lacks that path")
    yield request.param
    native.lib().mdk_select_path(2)  # back to the best the CPU has


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request, monkeypatch):
    monkeypatch.setattr(native, "_threads", request.param)
    return request.param


def q8_reference(x: torch.Tensor) -> torch.Tensor:
    """The activation as the Q4 kernel sees it: int8 per block of 32, scale amax / 127."""
    T, K = x.shape
    xb = x.float().reshape(T, K // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))  # a true division, as the kernel
    q = (xb * inv).round().clamp(-127, 127)
    return (q * (amax / 127.0)).reshape(T, K)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))

