"""Shared fixtures. GPU tests skip loudly (pytest -rs prints each reason) where no CUDA GPU is usable,
naming why; tests that need a file of ../shared/data skip naming the file."""
import os
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA_DIR = pathlib.Path(os.environ.get("TWELL_DATA_DIR", ROOT.parent / "shared" / "data"))


def gpu_reason():
    if not torch.cuda.is_available():
        return "SKIPPED: no CUDA GPU visible to PyTorch (the GPU tests need one)"
    import twell
    ctx = twell.Context(torch.cuda.current_device())
    if not ctx.has_gpu:
        return f"SKIPPED: twell sees no GPU: {ctx.no_gpu_reason}"
    return None


@pytest.fixture(scope="session")
def cuda():
    reason = gpu_reason()
    if reason:
        pytest.skip(reason)
    return torch.device("cuda", torch.cuda.current_device())


def data_file(name):
    path = DATA_DIR / name
    if not path.is_file():
        pytest.skip(f"SKIPPED: needs {path} (../shared/data, or $TWELL_DATA_DIR)")
    return path
