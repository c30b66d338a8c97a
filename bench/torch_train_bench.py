"""One FFN layer's training step (forward + backward with the L1 term), twell against PyTorch autograd,
in one process (issue 15 item 5; bench/README.md v45+).

Per M and density, the steps (each: y, l1 = FFN(x); backward of (y * dy).sum() + lambda * l1, bf16
operands, weights and x requiring grad, gradients in bf16 as autograd gives them):
  torch dense     PyTorch autograd of h = relu(x Wg^T) * (x Wu^T), y = h Wd^T (cuBLAS), l1 = sum |h| / M
                  (summed in fp32 without an fp32 copy of h)
  twell dense     dispatch="twell_dense": FfnTrainingPlan's dense path (cuBLASLt GEMMs, two elementwise kernels)
  twell sparse    twell.torch.sparse_ffn_train(..., dispatch="sparse"): FfnTrainingPlan's forward and backward
  twell auto      dispatch="auto" (per bucket, the fastest whole step of the three, timed once)
  twell split H   (real and pattern layers) dispatch="sparse", dense_neurons=H: the H most active neurons on twell's
                  dense kernels, the rest on TwELL, with the weights ordered hot-first (by the activity on the
                  call's x, before the timing: a reparametrization a training loop applies now and then)
Time: CUDA events around whole steps on the current stream (the host's work inside, as a training loop
sees it: twell's backward waits on the host for its forward's overflow count), median of --reps after
warm-up, the variants interleaved round by round; "in a row": --in-a-row steps enqueued back to back
between two events, per step (median of 3), as a training loop runs layers while the GPU works (the host's
launch latency before a step's first kernel then overlaps the previous step; not the issue's measure).
Memory ("peak MB over inputs"): the most memory the step held beyond its inputs (x, dy, the weights and
their gradient buffers, allocated before): torch's peak allocation during the step, plus, for twell, the
device memory its plans hold outside torch's allocator (states, backups, the backward's scratch: the
device-wide used memory after the variant's warm-up steps less torch's reserved memory, against the same
before them). "twell auto" is measured alone: twell.torch.training.clear() drops the other variants' plans
first, so it is charged for what auto keeps after its decision (the plan of the path it chose; the other
twell plan is released, _release_if_unused), as in a model that trains with auto (not the kernel modules
the other variants loaded into the context's cache: code, KB to a few MB); every variant then runs twice
more before the timing, so that the plans clear() dropped are made again, backups grown, outside it.
Inputs: "uniform" (Wg with a shifted first column so relu(g) > 0 with probability --densities, x uniform,
as python/tests/test_training_gpu.py), and "real" (the paper model's layer 1: its x tiled to M rows and its
Wg from ../shared/data or $TWELL_DATA_DIR, Wu and Wd random: about 5% dense), and with --patterns, "paper
layer L activity" (pattern_layer: uniform's construction with each neuron's own activation frequency as
measured on the paper model's layer L, paper_patterns.safetensors: its hot neurons).

  PYTHONPATH=python TWELL_LIB_DIR=build/lib .venv/bin/python bench/torch_train_bench.py --tokens 16384 65536
"""
import argparse
import functools
import json
import math
import os
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import twell
import twell.torch as tt

D_MODEL, D_FF = 2048, 5632


def uniform_layer(m, density, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.rand(m, D_MODEL, generator=g, device=dev) * 2 - 1
    x[:, 0] = 1
    wg = (torch.rand(D_FF, D_MODEL, generator=g, device=dev) * 2 - 1) / math.sqrt(D_MODEL)
    sigma = (wg[:, 1:].pow(2).sum(1) / 3).sqrt()
    wg[:, 0] = -sigma * float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - density)))
    wu = (torch.rand(D_FF, D_MODEL, generator=g, device=dev) * 2 - 1) / math.sqrt(D_MODEL)
    wd = (torch.rand(D_MODEL, D_FF, generator=g, device=dev) * 2 - 1) / math.sqrt(D_FF)
    return [t.to(torch.bfloat16) for t in (x, wg, wu, wd)]


REAL_FILES = ("paper_l1_gate_a.safetensors", "paper_l1_gate_b.safetensors", "paper_l1_x.safetensors")
PATTERN_FILE = "paper_patterns.safetensors"


def data_dir():
    return pathlib.Path(os.environ.get("TWELL_DATA_DIR", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))


def real_layer(m, dev):
    from safetensors.torch import load_file
    a, b, x = (load_file(data_dir() / f) for f in REAL_FILES)
    x = x["layers.1.x"].to(dev)
    wg = torch.cat([a["layers.1.gate.weight.rows0"], b["layers.1.gate.weight.rows1"]]).to(dev)
    g = torch.Generator(device=dev).manual_seed(1)  # only the gate was stored: random up and down
    wu = (torch.randn(wg.shape, generator=g, device=dev) * 0.02).to(torch.bfloat16)
    wd = (torch.randn(wg.shape[1], wg.shape[0], generator=g, device=dev) * 0.02).to(torch.bfloat16)
    return [x.repeat((m + x.shape[0] - 1) // x.shape[0], 1)[:m].contiguous(), wg, wu, wd]


def pattern_layer(m, layer, dev, seed=0):
    """uniform_layer with paper_patterns.safetensors' per-neuron activity of the paper model's `layer`: neuron
    j active on a token with that neuron's measured frequency (at least 1e-6), independently per token (the
    real layer's hot neurons, not its heavy rows), the neurons in a random order."""
    from safetensors.torch import load_file
    p = load_file(data_dir() / PATTERN_FILE)
    col = p[f"layers.{layer}.col"].long() % 65536  # int16 storage of 0..5631
    freq = torch.bincount(col, minlength=D_FF).double() / (p[f"layers.{layer}.row_ptr"].numel() - 1)
    g = torch.Generator(device=dev).manual_seed(seed)
    freq = freq[torch.randperm(D_FF, generator=torch.Generator().manual_seed(seed))].clamp(1e-6, 1 - 1e-6)
    x = torch.rand(m, D_MODEL, generator=g, device=dev) * 2 - 1
    x[:, 0] = 1
    wg = (torch.rand(D_FF, D_MODEL, generator=g, device=dev) * 2 - 1) / math.sqrt(D_MODEL)
    sigma = (wg[:, 1:].pow(2).sum(1) / 3).sqrt()
    wg[:, 0] = -sigma * torch.distributions.Normal(0, 1).icdf(1 - freq).to(dev, torch.float32)
    wu = (torch.rand(D_FF, D_MODEL, generator=g, device=dev) * 2 - 1) / math.sqrt(D_MODEL)
    wd = (torch.rand(D_MODEL, D_FF, generator=g, device=dev) * 2 - 1) / math.sqrt(D_FF)
    return [t.to(torch.bfloat16) for t in (x, wg, wu, wd)]


def step_operands(layer, dev):
    """A layer's operands (x, w_gate, w_up, w_down) as leaves with zeroed gradient buffers (they exist before
    a step, as in a training loop), and a dy of x's shape in [-1, 1) bf16."""
    leaves = [t.detach().requires_grad_() for t in layer]
    dy = (torch.rand(layer[0].shape[0], D_MODEL, device=dev) * 2 - 1).to(torch.bfloat16)
    for t in leaves:
        t.grad = torch.zeros_like(t)
    return leaves, dy


def torch_dense(x, wg, wu, wd):
    h = F.relu(F.linear(x, wg)) * F.linear(x, wu)
    return F.linear(h, wd), h.abs().sum(dtype=torch.float32) / x.shape[0]  # no fp32 copy of h


def used_device_bytes():
    free, total = torch.cuda.mem_get_info()
    return total - free


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536], help="rows M of the layer's calls")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.005, 0.01, 0.02, 0.05],
                    help="uniform densities (fractions of d_ff active per token)")
    ap.add_argument("--real", action=argparse.BooleanOptionalAction, default=True,
                    help="also the paper model's layer 1 (needs paper_l1_*.safetensors in ../shared/data or $TWELL_DATA_DIR)")
    ap.add_argument("--lam", type=float, default=1e-3, help="the L1 term's coefficient lambda in (y * dy).sum() + lambda * l1")
    ap.add_argument("--reps", type=int, default=12, help="timed steps per variant (in three interleaved rounds)")
    ap.add_argument("--in-a-row", type=int, default=8, help="steps per 'in a row' timing (0: none)")
    ap.add_argument("--patterns", type=int, nargs="*", default=[],
                    help="also layers of the paper model (0-3) with their measured per-neuron activity "
                         "(paper_patterns.safetensors; pattern_layer)")
    ap.add_argument("--splits", type=int, nargs="*", default=[512, 1024, 2048],
                    help="dense_neurons of the 'twell split' variants on the real layer (multiples of 64)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if any(h <= 0 or h % 64 or h >= D_FF for h in a.splits):
        ap.error(f"--splits: expected multiples of 64 in 64..{D_FF - 64}, got {a.splits}")
    if any(layer not in range(4) for layer in a.patterns):
        ap.error(f"--patterns: expected layers 0-3 of the paper model, got {a.patterns}")
    if a.real:  # checked first: a missing file must not cost the uniform cases' results
        missing = [f for f in REAL_FILES if not (data_dir() / f).is_file()]
        if missing:
            ap.error(f"--real needs {', '.join(missing)} in {data_dir()} (or $TWELL_DATA_DIR); pass --no-real to skip")
    if a.patterns and not (data_dir() / PATTERN_FILE).is_file():
        ap.error(f"--patterns needs {PATTERN_FILE} in {data_dir()} (or $TWELL_DATA_DIR)")
    t_start = time.time()
    log = lambda what: print(f"[{time.time() - t_start:6.1f} s] {what}", file=sys.stderr, flush=True)
    dev = torch.device("cuda")
    lam = torch.tensor(a.lam, device=dev)
    results = []
    cases = [(m, f"uniform {100 * d:g}%", d) for m in a.tokens for d in a.densities]
    if a.real:
        cases += [(m, "real paper layer 1", None) for m in a.tokens]
    cases += [(m, f"paper layer {layer} activity", layer) for m in a.tokens for layer in a.patterns]
    for m, pattern, density in cases:
        tt.training.clear()  # each case's plans and memory from scratch
        torch.cuda.empty_cache()
        ops = real_layer(m, dev) if density is None else pattern_layer(m, density, dev) if isinstance(density, int) \
            else uniform_layer(m, density, dev)
        leaves, dy = step_operands(ops, dev)
        with torch.no_grad():
            density_measured = (F.linear(ops[0], ops[1]) > 0).float().mean().item()

        def step(fn):
            y, l1 = fn(*leaves)
            torch.autograd.backward([y, l1], [dy, lam])

        variants = {
            "torch dense": lambda: step(torch_dense),
            "twell dense": lambda: step(lambda *t: tt.sparse_ffn_train(*t, dispatch="twell_dense")),
            "twell sparse": lambda: step(lambda *t: tt.sparse_ffn_train(*t, dispatch="sparse")),
            "twell auto": lambda: step(lambda *t: tt.sparse_ffn_train(*t, dispatch="auto")),
        }
        if (density is None or isinstance(density, int)) and a.splits:
            # The split on hot-first weights: the same layer with its hidden units reordered (the same function).
            order, _ = tt.training.hot_first_split(ops[0], ops[1], tokens=m)
            with torch.no_grad():
                hot_first = [ops[0], ops[1][order], ops[2][order], ops[3][:, order]]
            hot_leaves = [t.detach().contiguous().requires_grad_() for t in hot_first]
            for t in hot_leaves:
                t.grad = torch.zeros_like(t)

            def split_step(h):
                y, l1 = tt.sparse_ffn_train(*hot_leaves, dispatch="sparse", dense_neurons=h)
                torch.autograd.backward([y, l1], [dy, lam])

            for h in a.splits:
                variants[f"twell split {h}"] = functools.partial(split_step, h)
        memory = {}
        for name, fn in variants.items():  # warm-up (JIT, auto's timing), then the step's memory
            log(f"M={m} {pattern}: warm-up {name}")
            if name == "twell auto":
                tt.training.clear()  # auto alone: the other variants' plans dropped (made again below)
            torch.cuda.synchronize()
            before = used_device_bytes() - torch.cuda.memory_reserved()
            fn()
            fn()
            torch.cuda.synchronize()
            outside = max(0, used_device_bytes() - torch.cuda.memory_reserved() - before)
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            memory[name] = (torch.cuda.max_memory_allocated() - base + outside) / 2 ** 20
        for fn in variants.values():  # the plans clear() dropped, made again (and their backups grown) before the timing
            fn()
            fn()
        times = {k: [] for k in variants}
        for _ in range(3):  # interleaved rounds
            for k, fn in variants.items():
                for _ in range(max(1, a.reps // 3)):
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    stop.record()
                    stop.synchronize()
                    times[k].append(start.elapsed_time(stop))
        in_a_row = {k: [] for k in variants}
        for _ in range(3 if a.in_a_row > 0 else 0):
            for k, fn in variants.items():
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(a.in_a_row):
                    fn()
                stop.record()
                stop.synchronize()
                in_a_row[k].append(start.elapsed_time(stop) / a.in_a_row)
        base_ms = statistics.median(times["torch dense"])
        # auto's buckets are keyed by bit_length(tokens - 1): name them by their largest token count.
        decisions = {f"<={1 << d['bucket'][-1]} rows": d["path"] for d in tt.training.dispatch_decisions()}
        for k, v in times.items():
            med = statistics.median(v)
            results.append({"tokens": m, "pattern": pattern, "density": density_measured, "variant": k,
                            "median_ms": med, "min_ms": min(v), "speedup": base_ms / med,
                            "in_a_row_ms": statistics.median(in_a_row[k]) if in_a_row[k] else None,
                            "peak_mb_over_inputs": memory[k],
                            "auto_path": decisions if k == "twell auto" else None})
        del ops, leaves, dy
        hot_leaves = None
    print(f"\n{'M':>6} | {'pattern':20} | {'density':>7} | {'variant':16} | {'median ms':>9} | {'speedup':>7} | "
          f"{'in a row ms':>11} | peak MB over inputs")
    for r in results:
        row_ms = f"{r['in_a_row_ms']:11.2f}" if r["in_a_row_ms"] is not None else f"{'-':>11}"
        print(f"{r['tokens']:>6} | {r['pattern']:20} | {100 * r['density']:6.2f}% | {r['variant']:16} | "
              f"{r['median_ms']:9.2f} | {r['speedup']:6.2f}x | {row_ms} | {r['peak_mb_over_inputs']:8.0f}"
              + (f"  (auto: {r['auto_path']})" if r["auto_path"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
