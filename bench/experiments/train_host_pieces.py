"""Host microseconds of each piece of twell.torch.sparse_ffn_train's path before the C API call (issue 15;
bench/README.md v57): the argument checks, the spec, the stream (torch's Stream object against the raw
getter), the output allocations, and the forward alone under no_grad; medians, 16384 rows at 0.5%.

  PYTHONPATH=python TWELL_LIB_DIR=build/lib .venv/bin/python bench/experiments/train_host_pieces.py
"""
import pathlib, sys, time, statistics, torch
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torch_train_bench as b
import twell.torch as tt
from twell.torch import training, ops
dev = torch.device("cuda")
M = 16384
x, wg, wu, wd = [t.detach().requires_grad_() for t in b.uniform_layer(M, 0.005, dev)]
def t(name, fn, n=300):
    for _ in range(20): fn()
    ts = []
    for _ in range(n):
        a = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - a)
    print(f"{name:42s} {statistics.median(ts) / 1e3:7.1f} us")
spec = training.spec_of(x, wg, wu, "relu", 0.0)
t("check_args", lambda: ops.check_args("sparse_ffn_train", x, wg, wu, wd, "relu", 0.0, "sparse", 0, 0,
                                      ops.DEFAULT_MAX_TOKENS, gated=True))
t("spec_of (cached)", lambda: training.spec_of(x, wg, wu, "relu", 0.0))
t("is_current_stream_capturing", torch.cuda.is_current_stream_capturing)
t("trainable", lambda: training.trainable(x.device, spec, M))
t("x.device", lambda: x.device)
t("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream(x.device).cuda_stream)
t("ops.stream_handle", lambda: ops.stream_handle(x.device))
t("torch.empty y", lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device))
t("torch.empty row_l1", lambda: torch.empty(M, dtype=torch.float32, device=x.device))
t("needs_grad", lambda: torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, wg, wu, wd)))
with torch.no_grad():
    t("sparse_ffn_train no_grad (forward only)", lambda: tt.sparse_ffn_train(x, wg, wu, wd, dispatch="sparse"), n=100)
torch.cuda.synchronize()
