"""Where one layer's Python training step spends its time, host against GPU (issue 15; bench/README.md v51,
where it found every backward waiting on the host for its own kernels).

Per M (paper shape, uniform 0.5%), for PyTorch autograd and twell.torch.sparse_ffn_train(dispatch="sparse"),
the medians of 12 steps of:
  step                 CUDA events around forward + backward (as bench/torch_train_bench.py times a step)
  gpu_fwd / gpu_bwd    the events split at the forward's return (host latency before the first kernel
                       counts in gpu_fwd: the GPU is idle at a step's start here)
  host_fwd / host_bwd  the host's time in each call
  host_bwd_behind_sleep  the backward's host time when the stream is busy with a 10 ms torch.cuda._sleep
                       first: about the sleep or more means the backward waited for the GPU
Compare gpu_fwd and gpu_bwd with the C++ step's forward_ms and backward_ms (`train_bench
--benchmark_filter=BM_TrainingStep`), which are GPU time only.

  PYTHONPATH=python TWELL_LIB_DIR=build/lib .venv/bin/python bench/experiments/train_step_breakdown.py
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torch_train_bench as b  # noqa: E402
import twell.torch as tt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--density", type=float, default=0.005)
    ap.add_argument("--reps", type=int, default=12)
    a = ap.parse_args()
    dev = torch.device("cuda")
    for m in a.tokens:
        tt.training.clear()
        leaves = [t.detach().requires_grad_() for t in b.uniform_layer(m, a.density, dev)]
        for t in leaves:
            t.grad = torch.zeros_like(t)
        dy = (torch.rand(m, b.D_MODEL, device=dev) * 2 - 1).to(torch.bfloat16)
        lam = torch.tensor(1e-3, device=dev)
        paths = {"torch": b.torch_dense, "twell": lambda *t: tt.sparse_ffn_train(*t, dispatch="sparse")}
        event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        for name, fn in paths.items():
            for _ in range(3):  # warm-up: JIT, plans, states
                y, l1 = fn(*leaves)
                torch.autograd.backward([y, l1], [dy, lam])
            torch.cuda.synchronize()
            r = {k: [] for k in ("step", "gpu_fwd", "gpu_bwd", "host_fwd", "host_bwd", "host_bwd_behind_sleep")}
            for _ in range(a.reps):
                e = [event() for _ in range(3)]
                h0 = time.perf_counter()
                e[0].record()
                y, l1 = fn(*leaves)
                h1 = time.perf_counter()
                e[1].record()
                torch.autograd.backward([y, l1], [dy, lam])
                h2 = time.perf_counter()
                e[2].record()
                torch.cuda.synchronize()
                r["step"].append(e[0].elapsed_time(e[2]))
                r["gpu_fwd"].append(e[0].elapsed_time(e[1]))
                r["gpu_bwd"].append(e[1].elapsed_time(e[2]))
                r["host_fwd"].append((h1 - h0) * 1e3)
                r["host_bwd"].append((h2 - h1) * 1e3)
                y, l1 = fn(*leaves)
                torch.cuda.synchronize()
                torch.cuda._sleep(20_000_000)  # about 10 ms on an H200
                h0 = time.perf_counter()
                torch.autograd.backward([y, l1], [dy, lam])
                r["host_bwd_behind_sleep"].append((time.perf_counter() - h0) * 1e3)
                torch.cuda.synchronize()
            print(f"M={m} {name:6}", " ".join(f"{k}={statistics.median(v):.3f}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
