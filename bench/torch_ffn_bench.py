"""One gated FFN layer, twell against what a PyTorch user runs, in one process (bench/README.md v30+).

Rows (CUDA events, GPU time with the host's overhead hidden (twell.torch.timing), median of --reps after
warm-up, the variants interleaved round by round):
  torch dense          F.linear(relu(F.linear(x, Wg)) * F.linear(x, Wu), Wd): cuBLAS, PyTorch's default
  torch dense (Lt)     the same with torch.backends.cuda.preferred_blas_library("cublaslt")
  torch gate GEMM / down GEMM   the single GEMMs (where the dense time goes)
  twell dense cublaslt twell::DenseFfn, DenseKernels::CuBlasLt (cuBLASLt's first algorithm)
  twell dense fused    twell::DenseFfn, DenseKernels::FusedGatedUp (the plan's dense path)
  twell dense cublas   twell::DenseFfn, DenseKernels::CuBlas (cublasGemmEx as PyTorch calls it)
  twell dense cublaslt tuned   DenseKernels::CuBlasLtTuned (cuBLASLt's first 8 algorithms timed; with
                       cublas, what twellc run's baseline takes the faster of)
  twell sparse / auto  the plan (Dispatch Sparse / Auto) through twell.torch.sparse_gated_ffn
Weights are random with a gate threshold giving --density active neurons per token (uniform).

  PYTHONPATH=python TWELL_LIB_DIR=build/lib python bench/torch_ffn_bench.py --tokens 16384 131072
"""
import argparse
import faulthandler
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import twell
import twell.torch as tt
from twell.runtime import tensors_struct
from twell.torch.timing import cuda_event_times as timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--d-ff", type=int, default=5632)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 131072])
    ap.add_argument("--density", type=float, default=0.005)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    faulthandler.dump_traceback_later(180, exit=False)  # where it is, if a step is slow
    t_start = time.time()
    log = lambda what: print(f"[{time.time() - t_start:6.1f} s] {what}", file=sys.stderr, flush=True)
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    wg = (torch.randn(a.d_ff, a.d_model, device=dev) / a.d_model ** 0.5).to(dt)
    wu = (torch.randn(a.d_ff, a.d_model, device=dev) / a.d_model ** 0.5).to(dt)
    wd = (torch.randn(a.d_model, a.d_ff, device=dev) / a.d_ff ** 0.5).to(dt)
    thr = float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - a.density)))
    ctx = twell.Context(torch.cuda.current_device())
    results = []
    for m in a.tokens:
        x = torch.randn(m, a.d_model, device=dev, dtype=dt)
        y = torch.empty_like(x)
        stream = lambda: torch.cuda.current_stream().cuda_stream
        t = tensors_struct(x.data_ptr(), wg.data_ptr(), wu.data_ptr(), wd.data_ptr(), y.data_ptr())
        spec = twell.FfnSpec(a.d_model, a.d_ff, threshold=thr)
        lt = ctx.dense(spec, m, "cublaslt")
        fused = ctx.dense(spec, m, "fused_gated_up")
        blas = ctx.dense(spec, m, "cublas")
        tuned = ctx.dense(spec, m, "cublaslt_tuned")

        def torch_dense():
            return F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)

        def torch_dense_lt():
            torch.backends.cuda.preferred_blas_library("cublaslt")
            try:
                return torch_dense()
            finally:
                torch.backends.cuda.preferred_blas_library("cublas")

        h = torch.empty(m, a.d_ff, device=dev, dtype=dt)
        variants = {
            "torch dense": torch_dense,
            "torch dense (cublaslt backend)": torch_dense_lt,
            "torch gate GEMM": lambda: F.linear(x, wg),
            "torch down GEMM": lambda: F.linear(h, wd),
            "twell dense cublaslt": lambda: lt.run_struct(stream(), t, m),
            "twell dense fused": lambda: fused.run_struct(stream(), t, m),
            "twell dense cublas": lambda: blas.run_struct(stream(), t, m),
            "twell dense cublaslt tuned": lambda: tuned.run_struct(stream(), t, m),
            "twell sparse": lambda: tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, "sparse", max_tokens=m),
            "twell auto": lambda: tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, "auto", max_tokens=m),
        }
        for name, fn in variants.items():  # warm-up (JIT compiles, Auto's calibration)
            log(f"M={m}: warm-up {name}")
            fn(); fn()
            torch.cuda.synchronize()
        torch.cuda.synchronize()
        times = {k: [] for k in variants}
        for _ in range(4):  # interleaved rounds
            for k, fn in variants.items():
                times[k] += timed(fn, max(1, a.reps // 4))
        ref = torch_dense()
        for k in ("twell sparse", "twell auto"):
            out = variants[k]()
            assert torch.isfinite(out).all(), k
        base = statistics.median(times["torch dense"])
        for k, v in times.items():
            med = statistics.median(v)
            results.append({"tokens": m, "variant": k, "median_ms": med, "min_ms": min(v), "vs_torch_dense": base / med})
        del lt, fused, blas, tuned, x, y, h, ref
        torch.cuda.empty_cache()
    print(f"\n{'tokens':>7} | {'variant':32} | {'median ms':>9} | {'min ms':>8} | torch dense / this")
    for r in results:
        print(f"{r['tokens']:>7} | {r['variant']:32} | {r['median_ms']:9.3f} | {r['min_ms']:8.3f} | {r['vs_torch_dense']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "density": a.density,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
