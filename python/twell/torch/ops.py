"""The PyTorch operators (namespace `twell`), registered with torch.library.custom_op:

    torch.ops.twell.sparse_gated_ffn(x, w_gate, w_up, w_down, ...)  y = (act(x Wg^T) * (x Wu^T)) Wd^T
    torch.ops.twell.sparse_ffn(x, w_gate, w_down, ...)              y = act(x Wg^T) Wd^T

x [..., d_model] (any leading dims; the last dim contiguous, the leading ones collapsible into rows
with one row stride); w_gate, w_up [d_ff, d_model] and w_down [d_model, d_ff] (nn.Linear's weights;
each row contiguous; w_down's columns may be contiguous instead, the transpose of a contiguous [d_ff,
d_model]: twell's in_out layout, which the decode kernels read faster, see down_layout_of); all bf16 or
all fp16, on one CUDA device. y [..., d_model], contiguous, x's
dtype. act: "relu" (active iff relu(g) > threshold, threshold >= 0) or "silu" (|silu(g)| > threshold,
threshold > 0); the inactive neurons are exactly zero (twell/spec.h). Options: dispatch "auto" |
"sparse" | "dense" (twell/plan.h Dispatch), decode_max_tokens, dense_neurons (the hot/cold split:
the first dense_neurons neurons of d_ff run dense), max_tokens (the plan's largest workspace; longer
calls run in chunks), decision_key (Dispatch "auto" decides per key and token bucket: layers of one
shape pass different keys).

They run on the current CUDA stream, are capturable in CUDA graphs after a warm-up call of each
shape, have fake (meta) implementations (torch.compile fullgraph traces them without a graph
break), and an autograd formula: twell's sparse backward (twell/training_plan.h) after re-running the
training forward from the saved inputs (twell.torch.training.recompute_backward; a custom op cannot keep
the forward's TwELL state), or with dispatch "dense" PyTorch's dense ops recomputing g and u; both the
exact gradients of the thresholded activation (TRAINING.md, "The gradients"). For training with the L1
term and no recompute, twell.torch.sparse_ffn_train (twell.torch.training) keeps the forward's state.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import runtime
from .._errors import InvalidArgumentError
from . import _plans

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ACTIVATIONS = ("relu", "silu")
DISPATCHES = ("auto", "sparse", "dense")
DEFAULT_MAX_TOKENS = 16384
_specs: dict[tuple, tuple] = {}


def _fail(op: str, argument: str, expected: str, got) -> None:
    raise InvalidArgumentError(f"twell.{op}: {argument}: expected {expected}, got {got}")


def _row_stride(op: str, x: Tensor, d_model: int) -> int:
    """The row stride (elements) of x viewed as [rows, d_model]: the leading dims must collapse into
    rows one stride apart (size-1 dims are free); expanded rows (stride 0) are refused."""
    if d_model > 0 and x.dim() > 0 and x.shape[-1] == d_model and x.is_contiguous():
        return d_model  # (the common case first: a training step's host time before its first kernel)
    if x.dim() == 0 or x.shape[-1] != d_model:
        _fail(op, "x", f"a tensor [..., {d_model}] (d_model = w_gate.shape[1])", f"shape {tuple(x.shape)}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        _fail(op, "x", "a contiguous last dimension (stride 1)", f"strides {x.stride()}; call .contiguous()")
    lead = [(size, stride) for size, stride in zip(x.shape[:-1], x.stride()[:-1]) if size > 1]
    if not lead:
        return d_model  # at most one row
    for (size, stride), (next_size, next_stride) in zip(lead, lead[1:]):
        if stride != next_stride * next_size:
            _fail(op, "x", "leading dimensions that collapse into rows with one stride",
                  f"shape {tuple(x.shape)} with strides {x.stride()}; call .contiguous()")
    ld = lead[-1][1]
    if ld < d_model:
        _fail(op, "x", f"rows at least d_model = {d_model} elements apart (not expanded or overlapping)",
              f"a row stride of {ld} (shape {tuple(x.shape)}, strides {x.stride()}); call .contiguous()")
    return ld


def _check_weight(op: str, name: str, w: Tensor, shape: tuple, x: Tensor, columns_ok: bool = False) -> None:
    if w.shape == shape and w.dtype == x.dtype and w.stride(1) == 1 and w.stride(0) >= shape[1] and \
            w.device == x.device:
        return  # (the common case in one test: a training step's host time before its first kernel)
    if w.dim() != 2 or tuple(w.shape) != shape:
        _fail(op, name, f"shape {shape}", f"shape {tuple(w.shape)}")
    if w.dtype != x.dtype:
        _fail(op, name, f"x's dtype {x.dtype}", w.dtype)
    if w.device != x.device:
        _fail(op, name, f"x's device {x.device}", w.device)
    if columns_ok and w.stride(0) == 1 and w.stride(1) >= shape[0]:
        return  # contiguous columns: the in_out layout (down_layout_of)
    if w.stride(1) != 1 or w.stride(0) < shape[1]:
        _fail(op, name, "contiguous rows (stride (>= columns, 1))" + (
            " or contiguous columns (stride (1, >= rows)), the in_out layout" if columns_ok else ""),
            f"strides {w.stride()}; call .contiguous()")


def down_layout_of(w_down: Tensor) -> tuple[str, int]:
    """w_down [d_model, d_ff]'s layout for twell (FfnSpec.down_layout) and its stride in elements:
    ("out_in", row stride) for nn.Linear's contiguous rows, ("in_out", column stride) for contiguous
    columns (w_down the transpose of a contiguous [d_ff, d_model], e.g. after
    SparseGatedMLP.set_down_layout_("in_out")). In in_out each neuron's d_model values are one contiguous
    row, which the decode kernels read in 16-byte pieces; an out_in neuron is a column, one 2-byte value
    per 32-byte sector (bench/README.md v73: at 1-16 tokens and 0.5% density 1.5-1.9x PyTorch dense in_out,
    1.0-1.56x out_in)."""
    if w_down.shape[0] == 1:  # one row: its stride is free (PyTorch may give it 1)
        return "out_in", max(w_down.stride(0), w_down.shape[1])
    if not columns_contiguous(w_down):
        return "out_in", w_down.stride(0)
    return "in_out", max(w_down.stride(1), w_down.shape[0])


def columns_contiguous(w: Tensor) -> bool:
    """Whether the 2-D w has contiguous, non-overlapping columns and not contiguous rows (the in_out layout)."""
    return w.stride(1) != 1 and w.stride(0) == 1 and w.stride(1) >= w.shape[0]


_DTYPE_MAX = {dtype: torch.finfo(dtype).max for dtype in DTYPES}  # (torch.finfo per call: microseconds per step)
_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """The current CUDA stream of `device` (a CUDA tensor's device: its index is set) as the handle the C API
    takes. torch's _cuda_getCurrentRawStream (what torch.compile's generated code calls) where this torch has
    it: torch.cuda.current_stream(device) builds a Stream object per call (2.9 us against 0.2 on the H200's
    host, bench/README.md v57: host time before a step's first kernel)."""
    if _get_raw_stream is not None:
        return _get_raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def check_args(op: str, x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str,
               threshold: float, dispatch: str, decode_max_tokens: int, dense_neurons: int, max_tokens: int,
               gated: bool | None = None, down_columns: bool = True) -> int:
    """Checks every argument (real and fake tensors alike); returns x's row stride. `op` names the caller
    in the messages; gated (None: op is "sparse_gated_ffn") says whether w_up is an operand; down_columns
    whether w_down may have contiguous columns (down_layout_of; the inference operators)."""
    if gated is None:
        gated = op == "sparse_gated_ffn"
    # "meta": shape-only tensors (tracing without a GPU) reach the fake implementation only.
    if x.device.type not in ("cuda", "meta"):
        _fail(op, "x", "a CUDA tensor (twell runs on NVIDIA GPUs)", f"a tensor on {x.device}")
    if x.dtype not in DTYPES:
        _fail(op, "x", "dtype torch.bfloat16 or torch.float16 (model.to(torch.bfloat16))", x.dtype)
    for name, w in (("w_gate", w_gate), ("w_down", w_down)) + ((("w_up", w_up),) if gated else ()):
        if not isinstance(w, torch.Tensor):
            _fail(op, name, "a tensor", type(w).__name__)
    if w_gate.dim() != 2:
        _fail(op, "w_gate", "a 2-D weight [d_ff, d_model]", f"shape {tuple(w_gate.shape)}")
    d_ff, d_model = w_gate.shape
    ld_x = _row_stride(op, x, d_model)
    _check_weight(op, "w_gate", w_gate, (d_ff, d_model), x)
    if w_up is not None:
        _check_weight(op, "w_up", w_up, (d_ff, d_model), x)
    _check_weight(op, "w_down", w_down, (d_model, d_ff), x, columns_ok=down_columns)
    check_options(op, d_ff, activation, threshold, dispatch, decode_max_tokens, dense_neurons, max_tokens)
    # The gate's output is rounded to x's dtype: a threshold above its largest finite value keeps nothing.
    if threshold > _DTYPE_MAX[x.dtype]:
        _fail(op, "threshold", f"at most {_DTYPE_MAX[x.dtype]:g} with x's dtype {x.dtype} (its largest finite value: "
              "no activation could pass a larger threshold)", threshold)
    return ld_x


def check_options(op: str, d_ff: int, activation: str, threshold: float, dispatch: str, decode_max_tokens: int,
                  dense_neurons: int, max_tokens: int) -> None:
    """The options' rules (twell/spec.h, twell/plan.h), for the operators and SparseGatedMLP alike."""
    if activation not in ACTIVATIONS:
        _fail(op, "activation", "'relu' or 'silu'", repr(activation))
    if dispatch not in DISPATCHES:
        _fail(op, "dispatch", "'auto', 'sparse' or 'dense'", repr(dispatch))
    for name, value in (("max_tokens", max_tokens), ("dense_neurons", dense_neurons), ("decode_max_tokens", decode_max_tokens)):
        if not isinstance(value, int) or isinstance(value, bool):
            _fail(op, name, "an int", repr(value))
    if max_tokens < 1:
        _fail(op, "max_tokens", "a positive row count", max_tokens)
    if not (0 <= dense_neurons < d_ff and dense_neurons % 64 == 0):
        _fail(op, "dense_neurons", f"a multiple of 64 in 0..{d_ff - 1} (below d_ff = w_gate.shape[0])", dense_neurons)
    if not math.isfinite(threshold) or (activation == "relu" and threshold < 0) or (activation == "silu" and threshold <= 0):
        _fail(op, "threshold", ">= 0 for relu, > 0 for silu (whose activations are never exactly zero), finite", threshold)
    if not 0 <= decode_max_tokens <= 64:
        _fail(op, "decode_max_tokens", "0..64", decode_max_tokens)


def _forward(op: str, x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str, threshold: float,
             dispatch: str, decode_max_tokens: int, dense_neurons: int, max_tokens: int, decision_key: int) -> Tensor:
    ld_x = check_args(op, x, w_gate, w_up, w_down, activation, threshold, dispatch, decode_max_tokens, dense_neurons,
                      max_tokens)
    if x.device.type != "cuda":
        _fail(op, "x", "a CUDA tensor (twell runs on NVIDIA GPUs)", f"a tensor on {x.device}")
    d_ff, d_model = w_gate.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    tokens = x.numel() // d_model if d_model else 0
    if tokens == 0:
        return y
    threshold = float(threshold) + 0.0  # -0.0 -> +0.0: equal keys, and the kernels key the threshold's bits
    down_layout, ld_down = down_layout_of(w_down)
    key = (d_model, d_ff, w_up is not None, activation, threshold, x.dtype, dispatch, dense_neurons, decode_max_tokens,
           down_layout)
    made = _specs.get(key)
    if made is None:  # built (and validated) once per distinct call signature: per-call host time matters
        made = _specs[key] = (
            runtime.FfnSpec(d_model, d_ff, gated=w_up is not None, activation=activation, threshold=float(threshold),
                            dtype=DTYPES[x.dtype], down_layout=down_layout),
            runtime.PlanOptions(dispatch=dispatch, dense_neurons=dense_neurons, decode_max_tokens=decode_max_tokens))
    spec, options = made
    capturing = torch.cuda.is_current_stream_capturing()
    entry = _plans.plan_for(x.device, spec, options, max_tokens, tokens, capturing)
    stream = stream_handle(x.device)
    elem = x.element_size()
    t = runtime.tensors_struct(x.data_ptr(), w_gate.data_ptr(), w_up.data_ptr() if w_up is not None else None,
                               w_down.data_ptr(), y.data_ptr(), ld_x, w_gate.stride(0),
                               w_up.stride(0) if w_up is not None else 0, ld_down, d_model)
    x0, y0 = t.x, t.y
    for first in range(0, tokens, entry.capacity):
        rows = min(entry.capacity, tokens - first)
        if dispatch == "auto":
            bucket = entry.bucket(rows, decision_key)
            if bucket not in entry.seen:
                if capturing:
                    raise RuntimeError(
                        f"twell.{op}: the first call of {rows} tokens (decision key {decision_key}) during CUDA-graph "
                        "capture: dispatch 'auto' times its paths on that call, which synchronizes; run the same "
                        "call once before capture (warm-up), or use dispatch='sparse' or 'dense'")
                entry.seen.add(bucket)
        t.x, t.y = x0 + first * ld_x * elem, y0 + first * d_model * elem
        entry.plan.run_struct(stream, t, rows, decision_key)
    return y


@torch.library.custom_op("twell::sparse_gated_ffn", mutates_args=())
def sparse_gated_ffn(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, activation: str = "relu",
                     threshold: float = 0.0, dispatch: str = "auto", decode_max_tokens: int = 64, dense_neurons: int = 0,
                     max_tokens: int = DEFAULT_MAX_TOKENS, decision_key: int = 0) -> Tensor:
    """y = (act(x Wg^T) * (x Wu^T)) Wd^T through twell (see the module's documentation)."""
    return _forward("sparse_gated_ffn", x, w_gate, w_up, w_down, activation, threshold, dispatch, decode_max_tokens,
                    dense_neurons, max_tokens, decision_key)


@torch.library.custom_op("twell::sparse_ffn", mutates_args=())
def sparse_ffn(x: Tensor, w_gate: Tensor, w_down: Tensor, activation: str = "relu", threshold: float = 0.0,
               dispatch: str = "auto", decode_max_tokens: int = 64, dense_neurons: int = 0,
               max_tokens: int = DEFAULT_MAX_TOKENS, decision_key: int = 0) -> Tensor:
    """y = act(x Wg^T) Wd^T through twell (the non-gated FFN: the first linear layer plays the gate)."""
    return _forward("sparse_ffn", x, w_gate, None, w_down, activation, threshold, dispatch, decode_max_tokens,
                    dense_neurons, max_tokens, decision_key)


@sparse_gated_ffn.register_fake
def _(x, w_gate, w_up, w_down, activation="relu", threshold=0.0, dispatch="auto", decode_max_tokens=64,
      dense_neurons=0, max_tokens=DEFAULT_MAX_TOKENS, decision_key=0):
    check_args("sparse_gated_ffn", x, w_gate, w_up, w_down, activation, threshold, dispatch, decode_max_tokens,
               dense_neurons, max_tokens)
    return x.new_empty(x.shape)


@sparse_ffn.register_fake
def _(x, w_gate, w_down, activation="relu", threshold=0.0, dispatch="auto", decode_max_tokens=64, dense_neurons=0,
      max_tokens=DEFAULT_MAX_TOKENS, decision_key=0):
    check_args("sparse_ffn", x, w_gate, None, w_down, activation, threshold, dispatch, decode_max_tokens, dense_neurons,
               max_tokens)
    return x.new_empty(x.shape)


def activation_and_mask(g: Tensor, activation: str, threshold: float) -> tuple[Tensor, Tensor]:
    """(a, active) of the thresholded activation, as the dense computation rounds it: a = act(g) where
    active, else 0 (twell/spec.h: ReLU active iff relu(g) > threshold, SiLU iff |silu(g)| > threshold)."""
    a = F.relu(g) if activation == "relu" else F.silu(g)
    # In fp32, as twell compares: a 16-bit tensor against a Python float would round the threshold to
    # the tensor's dtype (bf16: 1.6449 -> 1.6484) and move the cut.
    a32 = a.float()
    active = (a32 > threshold) if activation == "relu" else (a32.abs() > threshold)
    active = active | torch.isnan(a)
    return a * active, active


def _activation_grad(g: Tensor, active: Tensor, activation: str) -> Tensor:
    """d act(g) / dg on the active set (0 elsewhere: the threshold cuts the inactive ones off)."""
    if activation == "relu":
        return active.to(g.dtype)
    s = torch.sigmoid(g.float())
    return (s * (1 + g.float() * (1 - s)) * active).to(g.dtype)


def _dense_backward(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, dy: Tensor, activation: str,
                    threshold: float) -> tuple:
    """(dx, dWg, dWu or None, dWd) of the FFN for dy with PyTorch's dense ops, recomputing g and u from x."""
    d_ff, d_model = w_gate.shape
    x2 = x.reshape(-1, d_model)
    dy2 = dy.reshape(-1, d_model).to(x.dtype)
    g = F.linear(x2, w_gate)
    a, active = activation_and_mask(g, activation, threshold)
    dh = dy2 @ w_down  # y = h Wd^T
    if w_up is not None:
        u = F.linear(x2, w_up)
        h = a * u
        du = dh * a
        dg = dh * u * _activation_grad(g, active, activation)
    else:
        h, du = a, None
        dg = dh * _activation_grad(g, active, activation)
    dx = dg @ w_gate
    if du is not None:
        dx = dx + du @ w_up
    d_w_up = du.t() @ x2 if du is not None else None
    return dx.reshape(x.shape), dg.t() @ x2, d_w_up, dy2.t() @ h


@torch.library.custom_op("twell::sparse_ffn_backward", mutates_args=())
def sparse_ffn_backward(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, dy: Tensor, activation: str,
                        threshold: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dWg, dWu, dWd [d_model, d_ff], contiguous rows) of the FFN for dy (dWu empty for
    w_up None): twell's sparse backward after re-running the training forward
    (twell.torch.training.recompute_backward), or the dense formula where the training kernels refuse the
    shape (training.trainable) or there are no rows. The operators' autograd formula, an operator itself so
    that torch.compile traces it (fake below); the shape decision is made here, on real sizes, not while
    tracing."""
    from .training import recompute_backward, trainable, spec_of
    tokens = x.numel() // w_gate.shape[1] if w_gate.shape[1] else 0
    # (A dtype twell does not take, from a direct call: the dense formula, as off CUDA.)
    if tokens > 0 and x.is_cuda and x.dtype in DTYPES and \
            trainable(x.device, spec_of(x, w_gate, w_up, activation, threshold), tokens):
        # (The training kernels read w_down's rows: an in_out one, down_layout_of, is copied to rows.)
        dx, d_w_gate, d_w_up, d_w_down = recompute_backward(x, w_gate, w_up, w_down.contiguous(), dy, activation, threshold)
    else:
        dx, d_w_gate, d_w_up, d_w_down = _dense_backward(x, w_gate, w_up, w_down, dy, activation, threshold)
    # Contiguous in every branch: the fake's strides (torch.compile checks them).
    return dx, d_w_gate, d_w_up if d_w_up is not None else x.new_empty(0), d_w_down.contiguous()


@sparse_ffn_backward.register_fake
def _(x, w_gate, w_up, w_down, dy, activation, threshold):
    return (x.new_empty(x.shape), w_gate.new_empty(w_gate.shape),
            w_up.new_empty(w_up.shape) if w_up is not None else x.new_empty(0), w_down.new_empty(w_down.shape))


def _setup_context(ctx, inputs, output):
    x, w_gate = inputs[0], inputs[1]
    gated = len(inputs) == 11
    w_up = inputs[2] if gated else None
    w_down = inputs[3] if gated else inputs[2]
    activation, threshold = (inputs[4], inputs[5]) if gated else (inputs[3], inputs[4])
    dispatch = inputs[6] if gated else inputs[5]
    ctx.save_for_backward(x, w_gate, w_up, w_down)
    ctx.activation, ctx.threshold, ctx.gated, ctx.dispatch = activation, threshold, gated, dispatch


def _backward(ctx, dy):
    """The exact gradients of the FFN (TRAINING.md): the sparse_ffn_backward operator (twell's sparse
    backward after re-running the training forward, or the dense formula for shapes the training kernels
    refuse), or PyTorch's dense ops recomputing g and u from the saved x: with dispatch "dense", a double
    backward (create_graph) and during CUDA-graph capture (training.sparse_backward_applies)."""
    x, w_gate, w_up, w_down = ctx.saved_tensors
    rest = (None,) * 7
    from .training import sparse_backward_applies
    if ctx.dispatch != "dense" and sparse_backward_applies(x):
        dx, d_w_gate, d_w_up, d_w_down = sparse_ffn_backward(x, w_gate, w_up, w_down, dy, ctx.activation, ctx.threshold)
    else:
        dx, d_w_gate, d_w_up, d_w_down = _dense_backward(x, w_gate, w_up, w_down, dy, ctx.activation, ctx.threshold)
    if ctx.gated:
        return (dx, d_w_gate, d_w_up, d_w_down) + rest
    return (dx, d_w_gate, d_w_down) + rest


sparse_gated_ffn.register_autograd(_backward, setup_context=_setup_context)
sparse_ffn.register_autograd(_backward, setup_context=_setup_context)


def forward_eager(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str, threshold: float,
                  dispatch: str, decode_max_tokens: int, dense_neurons: int, max_tokens: int, decision_key: int) -> Tensor:
    """The operators' CUDA implementation called directly, without the dispatcher: what
    SparseGatedMLP runs for plain tensors in eager mode without autograd (the dispatch of a custom
    op costs tens of microseconds of host time per call)."""
    op = "sparse_gated_ffn" if w_up is not None else "sparse_ffn"
    return _forward(op, x, w_gate, w_up, w_down, activation, threshold, dispatch, decode_max_tokens, dense_neurons,
                    max_tokens, decision_key)


def dense_forward(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str = "relu",
                  threshold: float = 0.0) -> Tensor:
    """The FFN as a PyTorch user computes it: for a plain ReLU (threshold 0) exactly
    F.linear(relu(F.linear(x, Wg)) * F.linear(x, Wu), Wd); else dense_reference (the same values:
    relu(g) is active iff it is nonzero)."""
    if activation == "relu" and threshold == 0.0:
        h = F.relu(F.linear(x, w_gate))
        if w_up is not None:
            h = h * F.linear(x, w_up)
        return F.linear(h, w_down)
    return dense_reference(x, w_gate, w_up, w_down, activation, threshold)


def dense_reference(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str = "relu",
                    threshold: float = 0.0) -> Tensor:
    """The same FFN with PyTorch dense ops (F.linear through cuBLAS), as a user of nn.Linear computes
    it: the baseline twell is measured and tested against."""
    g = F.linear(x, w_gate)
    a, _ = activation_and_mask(g, activation, threshold)
    h = a * F.linear(x, w_up) if w_up is not None else a
    return F.linear(h, w_down)
