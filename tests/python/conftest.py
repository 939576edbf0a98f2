"""Shared fixtures: a fresh random seed per session (FLASHPORT_TEST_SEED to replay), devices to test."""

import os
import zlib

import numpy as np
import pytest

try:
    import torch
except ImportError:  # the numpy-only tests still run
    torch = None

SESSION_SEED = int(os.environ.get("FLASHPORT_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def pytest_report_header(config):
    return f"flashport test seed: {SESSION_SEED} (replay with FLASHPORT_TEST_SEED={SESSION_SEED})"


@pytest.fixture(autouse=True)
def _seed(request):
    """Fresh inputs every run, yet each test is replayable from the session seed and its name."""
    seed = (SESSION_SEED + zlib.crc32(request.node.nodeid.encode())) % (2**31)
    np.random.seed(seed)
    if torch is not None:
        torch.manual_seed(seed)
    return seed


def devices():
    out = ["cpu"]
    if torch is not None and torch.cuda.is_available():
        out.append("cuda")
    return out


@pytest.fixture(params=devices())
def device(request):
    return request.param


requires_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
requires_cuda = pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """On CUDA, a case the backend declares unsupported ("cuda backend: ..." from the core) is skipped with
    that reason rather than failed, so the suite tracks the backend's coverage as it grows (pytest -rs)."""
    try:
        return (yield)
    except Exception as exc:  # ValueError, or opcheck's OpCheckError wrapping one
        params = getattr(getattr(pyfuncitem, "callspec", None), "params", {})
        if params.get("device") == "cuda" and "cuda backend:" in str(exc):
            pytest.skip(f"unsupported on CUDA: {exc}")
        raise
