"""The d_ff-sharded MLP over torch.distributed: 2 ranks on one GPU, gloo backend."""
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from conftest import gpu_reason


def _rank(rank, world, init_file, result_file):
    import twell.torch as tt
    # gloo binds to the interface of the host name, which may not resolve where there is no network.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # every rank builds the same full MLP
        mlp = nn.Module()
        mlp.gate_proj, mlp.up_proj = nn.Linear(512, 1408, bias=False), nn.Linear(512, 1408, bias=False)
        mlp.down_proj, mlp.act_fn = nn.Linear(1408, 512, bias=False), nn.ReLU()
        mlp = mlp.to("cuda", torch.bfloat16)
        x = torch.randn(37, 512, device="cuda", dtype=torch.bfloat16)
        tp = tt.TensorParallelSparseGatedMLP.from_mlp(mlp, dispatch="sparse")
        y = tp(x)
        ref = tt.dense_reference(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        if rank == 0:
            torch.save({"y": y.cpu(), "ref": ref.cpu(), "local_d_ff": tp.local.d_ff}, result_file)
    finally:
        dist.destroy_process_group()


def test_two_ranks_one_gpu_gloo():
    reason = gpu_reason()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory() as d:
        init_file, result_file = os.path.join(d, "init"), os.path.join(d, "result.pt")
        context = mp.spawn(_rank, args=(2, init_file, result_file), nprocs=2, join=False)
        deadline = time.time() + 240
        while not context.join(timeout=5):
            if time.time() > deadline:
                for p in context.processes:
                    p.kill()
                pytest.fail("the 2 ranks did not finish within 240 s (killed)")
        r = torch.load(result_file)
    assert r["local_d_ff"] == 704
    y, ref = r["y"].float(), r["ref"].float()
    assert torch.isfinite(y).all()
    assert (y - ref).abs().max().item() <= 0.02 * ref.abs().max().item()
