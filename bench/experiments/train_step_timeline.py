"""The GPU timeline of one layer's Python training step (issue 15; bench/README.md v53-v54): every kernel
and copy of the step with its start, the idle gap before it and its duration, from torch.profiler (CUPTI sees
twell's driver-API launches as well as PyTorch's), and the layer's activity statistics (density, hot neurons,
heaviest rows, tile-rows over the slots).

  PYTHONPATH=python TWELL_LIB_DIR=build/lib .venv/bin/python bench/experiments/train_step_timeline.py \
      --tokens 16384 --case 0.005 [--case real] [--torch]

--case: a uniform density (bench/torch_train_bench.py's random layer) or "real" (its real paper layer 1,
$TWELL_DATA_DIR or ../shared/data). --torch: PyTorch autograd's step too. The last of --steps profiled steps
is printed (times in ms from the step's start).
"""
import argparse
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torch_train_bench as b  # noqa: E402
import twell.torch as tt  # noqa: E402


def layer_stats(ops, m, tile_n=256):
    with torch.no_grad():
        act = torch.nn.functional.linear(ops[0], ops[1]) > 0
        col, row = act.sum(0).float(), act.sum(1).float()
        tiles = act[:, :act.shape[1] // tile_n * tile_n].reshape(m, -1, tile_n).sum(2)
        top = col.sort(descending=True).values
        return (f"density {act.float().mean().item():.4f}; per neuron max {col.max().item():.0f} of {m} tokens, "
                f"{(col > 0.1 * m).sum().item()} neurons on >10%, the top 64 hold {top[:64].sum().item() / max(col.sum().item(), 1):.3f} "
                f"of the entries; per row max {row.max().item():.0f}, mean {row.mean().item():.1f}; tile-rows over 31 slots "
                f"{(tiles > 31).float().mean().item():.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--case", action="append", help="a density (0.005) or 'real'; repeatable (default 0.005)")
    ap.add_argument("--torch", action="store_true", help="PyTorch autograd's step too")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    dev = torch.device("cuda")
    m = a.tokens
    for case in a.case or ["0.005"]:
        tt.training.clear()
        ops = b.real_layer(m, dev) if case == "real" else b.uniform_layer(m, float(case), dev)
        print(f"{case}: {layer_stats(ops, m)}")
        leaves = [t.detach().requires_grad_() for t in ops]
        for t in leaves:
            t.grad = torch.zeros_like(t)
        dy = (torch.rand(m, b.D_MODEL, device=dev) * 2 - 1).to(torch.bfloat16)
        lam = torch.tensor(1e-3, device=dev)
        paths = {"twell": lambda *t: tt.sparse_ffn_train(*t, dispatch="sparse")}
        if a.torch:
            paths["torch"] = b.torch_dense
        for name, fn in paths.items():
            def step():
                y, l1 = fn(*leaves)
                torch.autograd.backward([y, l1], [dy, lam])
            for _ in range(3):  # JIT, plans, states
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(a.steps):
                    with record_function(f"STEP{i}"):
                        step()
                    torch.cuda.synchronize()
            events = prof.events()
            last = max((e for e in events if e.name.startswith("STEP")), key=lambda e: e.time_range.start)
            t0 = last.time_range.start
            gpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and
                          t0 <= e.time_range.start < t0 + 100_000 and not e.name.startswith("STEP")),
                         key=lambda e: e.time_range.start)
            print(f"== {name}, {case}, M = {m}")
            prev = t0
            for e in gpu:
                print(f"  start {(e.time_range.start - t0) / 1e3:7.3f}  gap {(e.time_range.start - prev) / 1e3:6.3f}  "
                      f"ms {(e.time_range.end - e.time_range.start) / 1e3:6.3f}  {e.name[:80]}")
                prev = max(prev, e.time_range.end)
            print(f"  the last ends at {(prev - t0) / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
