"""Where the host's time goes in one Python training step before twell's first kernel (issue 15; bench/README.md
v56-v57): 16384 rows at 0.5%, the pieces of twell.torch.sparse_ffn_train timed with host clocks by wrapping
the Function's forward, _run_forward and the C API call (medians of 50 steps), and PyTorch's first F.linear.

  PYTHONPATH=python TWELL_LIB_DIR=build/lib .venv/bin/python bench/experiments/train_host_time.py
"""
import pathlib, sys, time, statistics, torch
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torch_train_bench as b
import twell.torch as tt
from twell import runtime
from twell.torch import training, ops
dev = torch.device("cuda")
M = 16384
leaves, dy = b.step_operands(b.uniform_layer(M, 0.005, dev), dev)
lam = torch.tensor(1e-3, device=dev)
marks = {}
orig_fwd = runtime.TrainingPlan.forward_struct
def fwd(self, *a, **k):
    marks["cpp_in"] = time.perf_counter(); r = orig_fwd(self, *a, **k); marks["cpp_out"] = time.perf_counter(); return r
runtime.TrainingPlan.forward_struct = fwd
orig_run = training._run_forward
def run_fwd(*a, **k):
    marks["run_forward"] = time.perf_counter(); return orig_run(*a, **k)
training._run_forward = run_fwd
orig_apply = training._SparseFfnTraining.forward
def fapply(*a, **k):
    marks["fn_forward"] = time.perf_counter(); return orig_apply(*a, **k)
training._SparseFfnTraining.forward = staticmethod(fapply)
r = {k: [] for k in ("to_apply", "apply_to_run", "run_to_cpp", "cpp", "after_cpp", "torch_first_linear")}
for i in range(60):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    y, l1 = tt.sparse_ffn_train(*leaves, dispatch="sparse")
    t1 = time.perf_counter()
    torch.autograd.backward([y, l1], [dy, lam])
    if i >= 10:
        r["to_apply"].append(marks["fn_forward"] - t0)
        r["apply_to_run"].append(marks["run_forward"] - marks["fn_forward"])
        r["run_to_cpp"].append(marks["cpp_in"] - marks["run_forward"])
        r["cpp"].append(marks["cpp_out"] - marks["cpp_in"])
        r["after_cpp"].append(t1 - marks["cpp_out"])
x, wg, wu, wd = leaves
for i in range(60):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g = torch.nn.functional.linear(x, wg)
    t1 = time.perf_counter()
    if i >= 10: r["torch_first_linear"].append(t1 - t0)
    del g
print("host us (median):", " ".join(f"{k}={statistics.median(v) * 1e6:.1f}" for k, v in r.items()))
