"""Decoding (issue 17): one gated FFN layer at 1-64 tokens, twell against what a PyTorch user runs, in
one process, every variant under a CUDA graph (what a serving loop that captures its decode step runs;
bench/README.md v70).

Each graph holds --calls calls that cycle over --layers copies of the layer's weights (so the weights
come from DRAM, as in a model whose layers do not all fit the L2: 4 x 69 MB at the paper's shape), and
is replayed --reps times between CUDA events after a warm-up replay; a row is the median per call.
Variants:
  torch dense          F.linear(relu(F.linear(x, Wg)) * F.linear(x, Wu), Wd): cuBLAS, PyTorch's default
  torch dense (Lt)     the same with torch.backends.cuda.preferred_blas_library("cublaslt")
  twell auto / sparse  twell.torch.sparse_gated_ffn with dispatch "auto" (the default: the decode
                       kernels or dense per token bucket, timed at its first call) or "sparse"
  ... Wd in_out        the same with Wd's columns contiguous (wd.t().contiguous().t(): the same
                       [d_model, d_ff] tensor, as SparseGatedMLP.set_down_layout_("in_out") stores it)
Weights are random; x's first value is 1 and Wg's first column -z |w_j| (z the normal's 1 - --density
quantile), so relu(x Wg^T) keeps --density of the neurons per token (uniform) with threshold 0, as the
GPU tests' make_random_ffn: a neuron that rounding flips contributes ~0 (a threshold above 0 would make
each flip a jump of threshold x u, and the paths' roundings do flip a few per token). Wd is
nn.Linear's [d_model, d_ff] (out_in), as a PyTorch model holds it, except in the "in_out" variants. Columns: us per call, torch dense
over this, the bytes a call must read over its time (dense: all three weights; twell: Wg and the union
of the call's active neurons' Wu and Wd rows, counted on the GPU), and that floor at 4.3 TB/s (the
H200's measured copy bandwidth, PERFORMANCE.md). twell's y is checked against the thresholded dense
function (relative error < 1e-2) before timing.

  PYTHONPATH=python TWELL_LIB_DIR=build/lib python bench/torch_decode_bench.py
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

import twell.torch as tt

COPY_BYTES_PER_SECOND = 4.3e12


def graph_us_per_call(fn, calls: int, reps: int) -> float:
    """fn(i) issues call i; a CUDA graph of `calls` calls, replayed `reps` times: median us per call."""
    for i in range(calls):  # warm-up outside the capture (JIT, plans, Auto's calibration)
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--d-ff", type=int, default=5632)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--density", type=float, nargs="+", default=[0.005, 0.02])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    if any(m < 1 or m > 64 for m in a.tokens):
        ap.error(f"--tokens: expected values in 1..64 (decode sizes), got {a.tokens}")
    if a.layers < 1 or a.calls < 1 or a.reps < 1:
        ap.error(f"--layers, --calls, --reps: expected >= 1, got {a.layers}, {a.calls}, {a.reps}")
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    K, N = a.d_model, a.d_ff
    layers = [((torch.randn(N, K, device=dev) / K ** 0.5).to(dt), (torch.randn(N, K, device=dev) / K ** 0.5).to(dt),
               (torch.randn(K, N, device=dev) / N ** 0.5).to(dt)) for _ in range(a.layers)]
    wd_in_out = [wd.t().contiguous().t() for _, _, wd in layers]  # the same values, contiguous columns
    dense_bytes = 3 * K * N * 2
    results = []
    for d_index, density in enumerate(a.density):
        # x ~ N(0, 1) past its first value (1): g_j ~ N(-z |w_j|, |w_j|^2), active with probability `density`.
        z = float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - density)))
        thr = 0.0
        for wg, _, _ in layers:
            wg[:, 0] = (-z * wg[:, 1:].float().norm(dim=1)).to(dt)
        for m in a.tokens:
            x = torch.randn(m, K, device=dev, dtype=dt)
            x[:, 0] = 1.0

            def torch_dense(i, lt=False):
                wg, wu, wd = layers[i % a.layers]
                if lt:
                    torch.backends.cuda.preferred_blas_library("cublaslt")
                try:
                    return F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)
                finally:
                    if lt:
                        torch.backends.cuda.preferred_blas_library("cublas")

            def twell_call(i, dispatch, in_out=False):
                wg, wu, wd = layers[i % a.layers]
                if in_out:
                    wd = wd_in_out[i % a.layers]
                # One decision key per (density, layout, layer copy): the copies are other layers of a model,
                # and a density's Wg is another layer again (a key shared across densities kept the first's choice).
                key = (2 * d_index + in_out) * a.layers + i % a.layers
                return tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, dispatch, max_tokens=64, decision_key=key)

            variants = {
                "torch dense": torch_dense,
                "torch dense (Lt)": lambda i: torch_dense(i, lt=True),
                "twell auto": lambda i: twell_call(i, "auto"),
                "twell sparse": lambda i: twell_call(i, "sparse"),
                "twell auto in_out": lambda i: twell_call(i, "auto", True),
                "twell sparse in_out": lambda i: twell_call(i, "sparse", True),
            }
            # The union of the call's active neurons (layer 0), and twell's y against the dense function.
            wg0 = layers[0][0]
            active = (F.linear(x, wg0).float() > thr)
            union = int(active.any(0).sum())
            must_read = K * N * 2 + union * 2 * K * 2
            ref = torch_dense(0).float()
            for name in ("twell auto", "twell sparse", "twell auto in_out", "twell sparse in_out"):
                err = float((variants[name](0).float() - ref).norm() / ref.norm().clamp_min(1e-30))
                if not err < 1e-2:
                    raise SystemExit(f"{name} at M = {m}, density {density}: relative error {err:.3e} against the dense function")
            for name, fn in variants.items():
                us = graph_us_per_call(fn, a.calls, a.reps)
                bytes_ = dense_bytes if name.startswith("torch") else must_read
                results.append({"tokens": m, "density": density, "variant": name, "us": us, "union": union,
                                "GB/s": bytes_ / us / 1e3, "floor_us": must_read / COPY_BYTES_PER_SECOND * 1e6,
                                "active_per_token": float(active.sum()) / m})
            base = next(r["us"] for r in results if r["tokens"] == m and r["density"] == density and r["variant"] == "torch dense")
            for r in results:
                if r["tokens"] == m and r["density"] == density:
                    r["vs_torch_dense"] = base / r["us"]
    print(f"\n{'M':>3} | {'density':>7} | {'variant':19} | {'us/call':>8} | torch dense / this | {'GB/s':>6} | union | floor us")
    for r in results:
        print(f"{r['tokens']:>3} | {r['density']:7.3%} | {r['variant']:19} | {r['us']:8.2f} | {r['vs_torch_dense']:17.2f}x | "
              f"{r['GB/s']:6.0f} | {r['union']:5d} | {r['floor_us']:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
