"""Training through twell: the FFN's forward and backward on twell's training kernels
(twell/training_plan.h, ../shared/design/TRAINING.md), as a torch.autograd.Function.

    y, l1 = twell.torch.sparse_ffn_train(x, w_gate, w_up, w_down)    # w_up None: the non-gated FFN
    loss = cross_entropy(head(y), target) + l1_coefficient * l1
    loss.backward()                                                  # dx, dWg, dWu, dWd from twell

y = (act(x Wg^T) * (x Wu^T)) Wd^T as twell.torch.sparse_gated_ffn computes it (the same kernels, bit for
bit, on the TwELL path); l1 = sum |h| / tokens (h = act(g) * u, over every row of x; an fp32 scalar),
the paper's sparsity penalty. Both carry gradients: the backward reads the L1 term's upstream gradient on
the device (no host synchronization for it) and folds it into dh (TRAINING.md, "The gradients").
On the TwELL path the forward keeps the TwELL matrix of act(g) and each entry's u (an FfnTrainingState: 8 bytes
per TwELL word, about 6 MB per thousand rows at the paper's shape) instead of the dense a, u and h autograd keeps;
twell's dense path keeps g and u (4 bytes per token and neuron: 23 MB per thousand rows there); the backward's
scratch is the shared plan's.

x [..., d_model], weights as nn.Linear's (w_down [d_model, d_ff]); bf16 or fp16, one CUDA device, contiguous
rows (a w_down with contiguous columns, the decode layout of SparseGatedMLP.set_down_layout_, is copied to
rows per call: train in out_in). The weight gradients come back in the weights' dtype (each rounded once from an fp32 sum over the
tokens, in token order: bitwise deterministic); dx in x's dtype. Gradient accumulation and master-weight
setups work as with nn.Linear (autograd accumulates; a cast of fp32 master weights passes the gradients
through). Weights may change every step: nothing is precomputed from them.

dispatch: "sparse" (always twell's TwELL kernels), "twell_dense" (twell's dense training path: cuBLASLt GEMMs
and two elementwise kernels, FfnTrainingPlan's TrainingPath::Dense; it keeps g and u, not PyTorch's a, u and
h), "dense" (PyTorch's own autograd of the same function, exact threshold semantics), "auto": per (layer
key, power-of-two token bucket) the first call times the three full steps (forward and backward, on up to
TIMING_ROWS of its own rows, synchronizing; the TwELL path last, its timing stopped after two steps where both
are over twice the faster dense path's) and keeps the fastest (bench/README.md v58: twell's dense path at
2-5% and on the real paper layer, 1.1-1.25x PyTorch's step), plus the one-time timing and compilation;
recalibrate() re-times (call it as the density moves); prepare() makes a call's plans ahead, in a background
thread (new shapes and splits compile for seconds). This "auto" is twell.torch's own: it uses plans of
fixed dispatch ("sparse", "dense"), not the plan-level TrainingDispatch::Auto of twell/training_plan.h.
SparseGatedMLP's dispatch takes "auto", "sparse" or "dense" (PyTorch's): a module reaches twell's dense path
through "auto". Eager mode only (the
forward keeps an opaque state: torch.compile graph-breaks here).
"""
from __future__ import annotations

import concurrent.futures
import functools
import threading

import torch
from torch import Tensor

from .. import _capi, runtime
from .._errors import CompileError, InvalidArgumentError
from . import _plans, ops

_lock = threading.Lock()
_training_plans: dict[tuple, "_TrainingEntry"] = {}
_paths: dict[tuple, str] = {}
_path_times: dict[tuple, dict[str, float]] = {}
DISPATCHES = ("auto", "sparse", "dense", "twell_dense")
_PLAN_PATHS = ("sparse", "dense")  # the training plans' dispatch per twell path (TrainingDispatch)


class _TrainingEntry:
    """A training plan shared by every layer of one (device, spec), and its free states (a state per
    forward in flight: each backward returns its forward's state)."""

    def __init__(self, plan: runtime.TrainingPlan, capacity: int):
        self.plan, self.capacity, self.free_states = plan, capacity, []

    def take_state(self) -> runtime.TrainingState:
        with _lock:
            if self.free_states:
                return self.free_states.pop()
        return self.plan.make_state()

    def give_back(self, state: runtime.TrainingState) -> None:
        with _lock:
            self.free_states.append(state)


_refused: dict[tuple, str] = {}  # (device, spec, plan path, dense_neurons) -> why the training kernels refuse it
# (device, spec, plan path, dense_neurons) that dispatch "sparse" / "twell_dense" calls use
_sparse_keys: set[tuple] = set()


_making: dict[tuple, tuple[concurrent.futures.Future, int]] = {}  # key -> (the entry being made, its capacity)
_generation = 0  # clear() and recalibrate() count up: a plan begun before either is not installed


def _entry(device: torch.device, spec: runtime.FfnSpec, tokens: int, path: str = "sparse",
           dense_neurons: int = 0) -> _TrainingEntry:
    """The training plan of (device, spec) whose dispatch is `path` ("sparse": the TwELL kernels, with the
    first dense_neurons neurons on the dense path's kernels: the split; "dense": twell's dense path), with
    room for `tokens` rows. The plan is made outside the module's lock (a new shape or split compiles for
    seconds: threads make plans of different keys at once, prepare()); a thread needing a plan another is
    making waits for that one (and takes its error where it asked for the same size; after a larger plan's
    error or an interrupt it makes its own). clear() forgets plans being made: they are not installed."""
    key = (device.index, spec, path, dense_neurons)
    entry = _training_plans.get(key)
    if entry is not None and entry.capacity >= tokens:
        return entry
    future: concurrent.futures.Future = concurrent.futures.Future()  # this call's, once it makes the plan
    entry = None
    try:  # (from the registration on, the future is completed whatever happens: waiters never hang on it)
        while True:
            with _lock:
                entry = _training_plans.get(key)
                if entry is not None and entry.capacity >= tokens:
                    return entry
                making = _making.get(key)
                capacity = max(_plans.MIN_CAPACITY, 1 << max(0, tokens - 1).bit_length())
                if making is None or making[1] < tokens:
                    _making[key] = (future, capacity)
                    generation = _generation
                    break
            try:
                made = making[0].result()
            except BaseException as e:
                if not making[0].done() or making[0].exception() is not e:
                    raise  # this thread's own interrupt, not the maker's error
                if isinstance(e, Exception) and making[1] == capacity:
                    raise  # the same request: its error is this call's
                made = None  # a larger plan's error (its size?) or the maker's interrupt: make this one here
            if made is not None and made.capacity >= tokens:
                return made  # (installed, or made across a clear(): this call's plan either way)
            with _lock:
                if _making.get(key) is making:
                    del _making[key]
        ctx = _plans.context(device)
        # dWd in nn.Linear's layout: autograd then adds contiguous rows into w_down.grad (bench/README.md v54).
        entry = _TrainingEntry(ctx.training_plan(spec, capacity, gradients_in_dtype=True, dw_down_as_weight=True,
                                                 dispatch=path, dense_neurons=dense_neurons), capacity)
        with _lock:
            if _generation == generation:  # (not after a clear() or recalibrate(): their plans are forgotten)
                current = _training_plans.get(key)
                if current is None or current.capacity < capacity:
                    _training_plans[key] = entry
                else:
                    entry = current  # a larger one was installed meanwhile: use the cached one
    except BaseException as e:
        if not future.done():
            future.set_exception(e)
        raise
    finally:
        if not future.done():
            future.set_result(entry)
        with _lock:
            if _making.get(key, (None,))[0] is future:
                del _making[key]
    return entry


def trainable(device: torch.device, spec: runtime.FfnSpec, tokens: int, path: str = "sparse",
              dense_neurons: int = 0) -> bool:
    """Whether twell's training kernels take this layer: False where they refuse its shape (d_model above
    16384, a d_ff beyond train_weight_grad's shared memory, a layout they cannot build: the inference
    plan may still take it), remembered per (device, spec, plan path, dense_neurons); the callers then train it with PyTorch's
    dense autograd. A refusal of this many rows alone (a smallest plan is made) is not remembered: False for
    this call only. Other errors propagate."""
    key = (device.index, spec, path, dense_neurons)
    if key in _refused:
        return False
    try:
        _entry(device, spec, max(tokens, 1), path, dense_neurons)
        return True
    except (InvalidArgumentError, CompileError) as e:
        if tokens > _plans.MIN_CAPACITY:  # refused for its size alone? (the plan's rows: PyTorch takes this call)
            try:
                _entry(device, spec, 1, path, dense_neurons)
                return False
            except (InvalidArgumentError, CompileError):
                pass
        _refused[key] = str(e)
        return False


def clear() -> None:
    """Forgets the training plans, their states and every dispatch "auto" decision."""
    global _generation
    with _lock:
        _generation += 1  # (plans still being made are then not installed; their waiters still get them)
        _training_plans.clear()
        _making.clear()
        _paths.clear()
        _path_times.clear()
        _sparse_keys.clear()


def _run_forward(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, spec: runtime.FfnSpec, ld_x: int,
                 outputs: bool = True, path: str = "sparse", dense_neurons: int = 0):
    """FfnTrainingPlan::forward on the current stream (the plan of `path`, _entry): (y, row_l1, what the
    backward needs); outputs False: the gate alone, y and row_l1 None (the state is all a recomputing
    backward needs)."""
    d_ff, d_model = w_gate.shape
    tokens = x.numel() // d_model
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if outputs else None
    row_l1 = torch.empty(max(tokens, 1), dtype=torch.float32, device=x.device) if outputs else None
    entry = _entry(x.device, spec, max(tokens, 1), path, dense_neurons)
    state = entry.take_state()
    stream = ops.stream_handle(x.device)
    t = runtime.tensors_struct(x.data_ptr(), w_gate.data_ptr(), w_up.data_ptr() if w_up is not None else None,
                               w_down.data_ptr(), y.data_ptr() if outputs else None, ld_x, w_gate.stride(0),
                               w_up.stride(0) if w_up is not None else 0, w_down.stride(0), d_model if outputs else 0)
    try:
        entry.plan.forward_struct(stream, t, tokens, state, row_l1.data_ptr() if outputs else None)
    except BaseException:
        entry.give_back(state)
        raise
    return y, row_l1[:tokens] if outputs else None, (entry, state, tokens)


def _run_backward(saved, x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, dy: Tensor | None,
                  l1_weight: Tensor | None):
    """FfnTrainingPlan::backward for the forward `saved` came from; gives its state back. The operands'
    pointers are taken from the tensors given here (autograd's unpacked saved tensors: saved-tensor hooks,
    checkpointing or resharding may have moved them since the forward). Returns (dx, dWg, dWu or None, dWd
    in nn.Linear's layout, contiguous: the plan's dw_down_as_weight)."""
    entry, state, tokens = saved
    d_ff, d_model = w_gate.shape
    try:
        if x.numel() != tokens * d_model:
            raise RuntimeError(f"twell.sparse_ffn_train: backward: the saved x has {x.numel() // max(d_model, 1)} rows, "
                               f"its forward {tokens}")
        ld_x = ops._row_stride("sparse_ffn_train", x, d_model)
        t = runtime.tensors_struct(x.data_ptr(), w_gate.data_ptr(), w_up.data_ptr() if w_up is not None else None,
                                   w_down.data_ptr(), None, ld_x, w_gate.stride(0),
                                   w_up.stride(0) if w_up is not None else 0, w_down.stride(0), 0)
        dy = torch.zeros(x.shape, dtype=x.dtype, device=x.device) if dy is None else dy.to(x.dtype).contiguous()
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        dw_gate = torch.empty((d_ff, d_model), dtype=w_gate.dtype, device=x.device)
        dw_up = torch.empty((d_ff, d_model), dtype=w_up.dtype, device=x.device) if w_up is not None else None
        dw_down = torch.empty((d_model, d_ff), dtype=w_down.dtype, device=x.device)  # as the weight
        g = _capi.FfnGradients(dx.data_ptr(), dw_gate.data_ptr(), dw_up.data_ptr() if dw_up is not None else None,
                               dw_down.data_ptr(), d_model, d_model, d_model if dw_up is not None else 0, d_ff)
        stream = ops.stream_handle(x.device)
        entry.plan.backward_struct(stream, t, dy.data_ptr(), d_model, tokens, state, g,
                                   1.0 if l1_weight is not None else 0.0, tokens,
                                   l1_weight.data_ptr() if l1_weight is not None else None)
    finally:
        entry.give_back(state)
    return dx, dw_gate, dw_up, dw_down


class _SparseFfnTraining(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, spec: runtime.FfnSpec,
                ld_x: int, path: str, dense_neurons: int):
        y, row_l1, saved = _run_forward(x, w_gate, w_up, w_down, spec, ld_x, path=path, dense_neurons=dense_neurons)
        l1 = row_l1.sum() / max(saved[2], 1)
        ctx.save_for_backward(x, w_gate, w_up, w_down)
        ctx.saved = saved
        ctx.set_materialize_grads(False)  # an unused y or l1 gives None: no L1 term, no zero dy
        return y, l1

    @staticmethod
    @torch.autograd.function.once_differentiable  # no double backward (create_graph): an error, not zeros
    def backward(ctx, dy: Tensor | None, dl1: Tensor | None):
        x, w_gate, w_up, w_down = ctx.saved_tensors
        saved, ctx.saved = ctx.saved, None
        if saved is None:
            raise RuntimeError("twell.sparse_ffn_train: backward ran twice through one graph (retain_graph=True): the "
                               "forward's TwELL state was given back after the first backward")
        l1_weight = dl1.to(torch.float32).reshape(1).contiguous() if dl1 is not None else None
        dx, dw_gate, dw_up, dw_down = _run_backward(saved, x, w_gate, w_up, w_down, dy, l1_weight)
        return dx, dw_gate, dw_up, dw_down, None, None, None, None


def recompute_backward(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, dy: Tensor, activation: str,
                       threshold: float) -> tuple:
    """(dx, dWg, dWu or None, dWd) of the FFN for dy without a saved state: the training forward's gate runs
    again into a state (no consumer: no y), then the sparse backward (no L1 term). The autograd formula of the
    twell.sparse_gated_ffn / sparse_ffn operators where sparse_backward_applies(): a custom op's forward
    cannot hand an opaque state to its backward. The re-run costs the gate GEMM (against the dense
    recompute's two GEMMs), and the backward then waits on the host for that forward's
    gate (its overflow count; sparse_ffn_train, which keeps the state, does not wait)."""
    ld_x = ops._row_stride("sparse_ffn_train", x, w_gate.shape[1])
    _, _, saved = _run_forward(x, w_gate, w_up, w_down, spec_of(x, w_gate, w_up, activation, threshold), ld_x,
                               outputs=False)
    return _run_backward(saved, x, w_gate, w_up, w_down, dy, None)


def sparse_backward_applies(x: Tensor) -> bool:
    """Whether the operators' autograd takes the sparse_ffn_backward operator: not for a double backward
    (grad mode on: create_graph), not during CUDA-graph capture (the backward waits on the host), not off
    CUDA. Nothing here reads a size, so tracing with symbolic shapes decides it too; the operator itself
    takes the dense formula for shapes the training kernels refuse (trainable())."""
    return not torch.is_grad_enabled() and x.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def spec_of(x: Tensor, w_gate: Tensor, w_up: Tensor | None, activation: str, threshold: float) -> runtime.FfnSpec:
    """The FfnSpec of a call (sizes from w_gate [d_ff, d_model], dtype from x)."""
    d_ff, d_model = w_gate.shape
    # (+ 0.0: -0.0 == 0.0 share a cache key, and the kernels key the threshold's bits: always +0.0.)
    return _spec(d_model, d_ff, w_up is not None, activation, float(threshold) + 0.0, ops.DTYPES[x.dtype])


@functools.lru_cache(maxsize=256)
def _spec(d_model: int, d_ff: int, gated: bool, activation: str, threshold: float, dtype: str) -> runtime.FfnSpec:
    # One FfnSpec per layer shape (frozen: shared safely): its validation runs once, not on every step.
    return runtime.FfnSpec(d_model, d_ff, gated=gated, activation=activation, threshold=threshold, dtype=dtype)


def _dense_train(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str,
                 threshold: float) -> tuple[Tensor, Tensor]:
    """The same function with PyTorch's autograd (the baseline): y and l1 = sum |h| / tokens, as a PyTorch
    user writes it (a plain ReLU at threshold 0 is relu(g); the L1 sum accumulates in fp32 without an
    fp32 copy of h, whose autograd would keep 4 bytes per hidden activation)."""
    g = torch.nn.functional.linear(x, w_gate)
    if activation == "relu" and threshold == 0.0:
        a = torch.nn.functional.relu(g)  # active iff relu(g) > 0: the same function
    else:
        a, _ = ops.activation_and_mask(g, activation, threshold)
    h = a * torch.nn.functional.linear(x, w_up) if w_up is not None else a
    tokens = max(x.numel() // x.shape[-1], 1)
    return torch.nn.functional.linear(h, w_down), h.abs().sum(dtype=torch.float32) / tokens


def _sparse_train(x, w_gate, w_up, w_down, spec, ld_x, path="sparse", dense_neurons=0):
    return _SparseFfnTraining.apply(x, w_gate, w_up, w_down, spec, ld_x, path, dense_neurons if path == "sparse" else 0)


TIMING_ROWS = 32768  # dispatch "auto" times the paths on at most this many of the call's rows


def _step_ms(fn, x: Tensor, weights: list, reps: int = 3, give_up_ms: float = float("inf")) -> float:
    """Median GPU time of a whole step (forward and backward) of fn on detached copies of the inputs:
    their first TIMING_ROWS rows (the whole call up to there: twell's fixed costs amortize with the rows,
    so fewer rows than the call would favour dense; bench/README.md v44 saw 8192 rows choose dense where
    the call's 32768 rows need not). One warm-up, then reps timed steps; where the first two timed steps
    both take over give_up_ms, their mean (the median of three would be over give_up_ms too, whatever the
    third: the TwELL path at a dense phase's density, a model's first steps, runs 10-50x the dense step)."""
    x = x.reshape(-1, x.shape[-1])[:TIMING_ROWS].contiguous()
    leaves = [x.detach().requires_grad_()] + [w.detach().requires_grad_() if w is not None else None for w in weights]
    dy = torch.randn_like(x)
    times = []
    for _ in range(reps + 1):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        with torch.enable_grad():
            y, l1 = fn(*leaves)
            torch.autograd.backward((y, l1), (dy, torch.ones_like(l1)))
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        for leaf in leaves:
            if leaf is not None:
                leaf.grad = None
        if len(times) == 3 and min(times[1:]) > give_up_ms:
            return (times[1] + times[2]) / 2
    return sorted(times[1:])[len(times[1:]) // 2]


def _release_if_unused(bucket: tuple, device_spec: tuple) -> None:
    """After a bucket's decision: each twell training plan of the layer shape (sparse, twell_dense) that no
    bucket of that shape chose and no dispatch "sparse" / "twell_dense" call uses is dropped (its states and
    the backward's scratch: without this, a layer that trains on PyTorch's path would hold more memory than
    PyTorch alone, bench/README.md v48). Steps in flight keep their plan through the state they saved; a
    later decision for it makes it again (kernels from the cache)."""
    with _lock:
        for plan_path, dispatch in (("sparse", "sparse"), ("dense", "twell_dense")):
            for key in [k for k in _training_plans if k[:3] == device_spec + (plan_path,)]:
                # (buckets: decision_key, device .. dtype, dense_neurons, size; a TwELL plan serves one split)
                if key not in _sparse_keys and \
                        not any(path == dispatch and b[1:8] == bucket[1:8] and (plan_path == "dense" or b[8] == key[3])
                                for b, path in list(_paths.items())):
                    _training_plans.pop(key, None)


def sparse_ffn_train(x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, activation: str = "relu",
                     threshold: float = 0.0, dispatch: str = "sparse", decision_key: int = 0,
                     dense_neurons: int = 0) -> tuple[Tensor, Tensor]:
    """(y, l1) of the FFN with twell's training kernels (see the module's documentation). PyTorch's dense
    autograd of the same function takes the calls twell's training kernels cannot: a shape they refuse
    (trainable()), CUDA-graph capture (the backward waits on the host), and, with dispatch "auto", the
    buckets where it was faster. Without grad (no_grad, or nothing requiring it) the forward runs alone and
    keeps no state. dense_neurons: the TwELL path's hot/cold split (TrainingPlanOptions::dense_neurons: a
    multiple of 64 below d_ff): the first dense_neurons neurons run on twell's dense kernels, the rest on
    TwELL; for weights ordered hot-first (most active neurons first: the order is the caller's, a
    reparametrization of the layer to apply to the weights and their optimizer state together)."""
    op = "sparse_ffn_train"
    if dispatch not in DISPATCHES:
        ops._fail(op, "dispatch", "'auto', 'sparse', 'twell_dense' or 'dense'", repr(dispatch))
    if not isinstance(dense_neurons, int) or isinstance(dense_neurons, bool) or dense_neurons < 0 or \
            dense_neurons % 64 != 0 or (isinstance(w_gate, torch.Tensor) and w_gate.dim() == 2 and
                                        dense_neurons >= max(w_gate.shape[0], 1)):
        ops._fail(op, "dense_neurons", "a multiple of 64 below d_ff (0: no split)", repr(dense_neurons))
    if not isinstance(w_gate, torch.Tensor) or w_gate.dim() != 2:
        ops._fail(op, "w_gate", "a 2-D weight [d_ff, d_model]", getattr(w_gate, "shape", type(w_gate).__name__))
    d_ff = w_gate.shape[0]
    if isinstance(w_down, torch.Tensor) and w_down.dim() == 2 and ops.columns_contiguous(w_down):
        # The training kernels read w_down's rows: an in_out w_down (for decoding, SparseGatedMLP.set_down_layout_)
        # is copied to rows per call (autograd passes the gradient through the copy); train in out_in.
        w_down = w_down.contiguous()
    ld_x = ops.check_args(op, x, w_gate, w_up, w_down, activation, threshold, "sparse", 0, 0, ops.DEFAULT_MAX_TOKENS,
                          gated=w_up is not None, down_columns=False)
    if x.device.type != "cuda":
        ops._fail(op, "x", "a CUDA tensor (twell runs on NVIDIA GPUs)", f"a tensor on {x.device}")
    d_model = w_gate.shape[1]
    tokens = x.numel() // d_model if d_model else 0
    spec = spec_of(x, w_gate, w_up, activation, threshold)
    # (dense_neurons in the key: a new split is timed again, not the decision of the old one)
    bucket = (decision_key, x.device.index, d_model, d_ff, w_up is not None, activation, float(threshold), x.dtype,
              dense_neurons, max(0, tokens - 1).bit_length())
    # A bucket auto decided dense goes there before trainable(), which would make the training plan again
    # (and trainable() makes the plan of the path the call takes: "dense" for twell_dense).
    plan_path = "dense" if dispatch == "twell_dense" or (dispatch == "auto" and _paths.get(bucket) == "twell_dense") \
        else "sparse"
    split = dense_neurons if plan_path == "sparse" else 0
    if dispatch == "dense" or tokens == 0 or torch.cuda.is_current_stream_capturing() or \
            (dispatch == "auto" and _paths.get(bucket) == "dense") or \
            not trainable(x.device, spec, tokens, plan_path, split):
        return _dense_train(x, w_gate, w_up, w_down, activation, threshold)
    if dispatch in ("sparse", "twell_dense") and (x.device.index, spec, plan_path, split) not in _sparse_keys:
        with _lock:  # (the test first: a step's host time before its first kernel, bench/README.md v62)
            _sparse_keys.add((x.device.index, spec, plan_path, split))
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w_gate, w_up, w_down))
    if not needs_grad:  # no backward will come: the forward alone, its state given back at once
        y, row_l1, (entry, state, _) = _run_forward(x, w_gate, w_up, w_down, spec, ld_x, path=plan_path,
                                                    dense_neurons=split)
        entry.give_back(state)  # the stream orders the next use after this forward
        return y, row_l1.sum() / tokens
    if dispatch == "auto":
        path = _paths.get(bucket)
        if path is None:
            weights = [w_gate, w_up, w_down]
            # The dense paths first; the TwELL path's timing stops early where two steps are over twice the faster.
            dense_times = {"torch": _step_ms(lambda *a: _dense_train(*a, activation, threshold), x, weights)}
            if trainable(x.device, spec, tokens, "dense"):  # (a dense plan that cannot be made is not a candidate)
                dense_times["twell_dense"] = _step_ms(lambda *a: _sparse_train(a[0], a[1], a[2], a[3], spec, d_model,
                                                                               "dense"), x, weights)
            times = {"twell": _step_ms(lambda *a: _sparse_train(a[0], a[1], a[2], a[3], spec, d_model,
                                                                dense_neurons=dense_neurons), x, weights,
                                       give_up_ms=2 * min(dense_times.values()))}
            times.update((k, dense_times[k]) for k in ("twell_dense", "torch") if k in dense_times)
            fastest = min(times, key=times.get)  # (ties: the first, twell's TwELL path, then twell's dense)
            path = {"twell": "sparse", "twell_dense": "twell_dense", "torch": "dense"}[fastest]
            with _lock:
                _paths[bucket], _path_times[bucket] = path, times
            _release_if_unused(bucket, (x.device.index, spec))
        if path == "dense":
            return _dense_train(x, w_gate, w_up, w_down, activation, threshold)
        plan_path = "dense" if path == "twell_dense" else "sparse"
    return _sparse_train(x, w_gate, w_up, w_down, spec, ld_x, plan_path, dense_neurons)


_preparing: concurrent.futures.ThreadPoolExecutor | None = None


def prepare(w_gate: Tensor, w_up: Tensor | None, w_down: Tensor, *, tokens: int, dtype: torch.dtype | None = None,
            activation: str = "relu", threshold: float = 0.0, dispatch: str = "sparse",
            dense_neurons: int = 0) -> concurrent.futures.Future:
    """Makes, in a background thread, the training plans that sparse_ffn_train(x, w_gate, w_up, w_down, ...)
    with these arguments and `tokens` rows of x takes at its first call: the TwELL path's (with the split
    dense_neurons) for dispatch "sparse", twell's dense path's for "twell_dense", both for "auto", none for
    "dense". Only the weights' shapes, strides and device are read: dtype is the call's (x's; default the
    weights'), so fp32 master weights whose casts the call will take are prepared with dtype=torch.bfloat16.
    A new layer shape or split compiles its kernels for about 2 s on an H200's host (bench/README.md v61);
    layers prepared together compile at once instead of one after another in their first steps (a model's
    split re-timing, v63). Returns a Future whose result is None once the plans are made (a shape the
    training kernels refuse is remembered as trainable() does: the call then takes PyTorch's autograd); it
    raises the other errors. Waiting on it is optional: a call that needs a plan still being made waits for
    it. The arguments are checked here, in the caller's thread. recalibrate() and clear() drop the plans
    (their kernels stay in the context's cache): prepare after them, not before."""
    op = "training.prepare"
    if dispatch not in DISPATCHES:
        ops._fail(op, "dispatch", "'auto', 'sparse', 'twell_dense' or 'dense'", repr(dispatch))
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 1 <= tokens <= 2 ** 30:
        ops._fail(op, "tokens", "an int in 1..2**30 (the rows of x the training calls will pass)", repr(tokens))
    for name, w in (("w_gate", w_gate), ("w_down", w_down)) + ((("w_up", w_up),) if w_up is not None else ()):
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            ops._fail(op, name, "a 2-D weight tensor", getattr(w, "shape", type(w).__name__))
        if w.device.type not in ("cuda", "meta"):  # (meta: shape-only weights, checked, then refused below)
            ops._fail(op, name, "a CUDA tensor (twell runs on NVIDIA GPUs)", f"a tensor on {w.device}")
        if w.device != w_gate.device:
            ops._fail(op, name, f"a tensor on w_gate's device {w_gate.device}", f"a tensor on {w.device}")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or dtype not in ops.DTYPES):
        ops._fail(op, "dtype", "torch.bfloat16 or torch.float16 (the call's x dtype), or None (the weights')", dtype)
    if dtype is None and w_gate.dtype not in ops.DTYPES:
        ops._fail(op, "dtype", "the call's x dtype, torch.bfloat16 or torch.float16 (None takes the weights', here "
                  f"{w_gate.dtype}: fp32 master weights are cast by the call)", None)
    # The call's checks on shape-only stand-ins: a row of x in the call's dtype and the weights as the call gets
    # them: as they are (dtype None), or their casts to dtype (w.to(dtype)'s layout: empty_like's).
    x = torch.empty((1, w_gate.shape[1]), dtype=dtype or w_gate.dtype, device="meta")
    stand_in = [None if w is None else torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device="meta")
                if dtype is None or w.dtype == dtype else torch.empty_like(w, dtype=dtype, device="meta")
                for w in (w_gate, w_up, w_down)]
    ops.check_args(op, x, *stand_in, activation, threshold, "sparse", 0, dense_neurons, ops.DEFAULT_MAX_TOKENS,
                   gated=w_up is not None)  # (an in_out w_down: the call copies it to rows, the same plans)
    if w_gate.device.type != "cuda":
        ops._fail(op, "w_gate", "a CUDA tensor (twell runs on NVIDIA GPUs)", f"a tensor on {w_gate.device}")
    device = w_gate.device if w_gate.device.index is not None else torch.device("cuda", torch.cuda.current_device())
    spec = spec_of(x, w_gate, w_up, activation, threshold)  # (the stand-in x: the call's dtype)
    paths = {"sparse": [("sparse", dense_neurons)], "twell_dense": [("dense", 0)],
             "auto": [("sparse", dense_neurons), ("dense", 0)], "dense": []}[dispatch]
    global _preparing
    with _lock:
        if _preparing is None:
            _preparing = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="twell-prepare")

    def make() -> None:
        for path, split in paths:
            trainable(device, spec, tokens, path, split)  # (a refusal is remembered, other errors raise)
    return _preparing.submit(make)


@torch.no_grad()
def hot_first_split(x: Tensor, w_gate: Tensor, activation: str = "relu", threshold: float = 0.0, *, tokens: int,
                    gated: bool = True) -> tuple[Tensor, int]:
    """(order, dense_neurons) for a training split (sparse_ffn_train's dense_neurons): each neuron's activity over
    the rows of x (a calibration sample of the layer's inputs, [..., d_model]; the activity on g = x Wg^T
    rounded to x's dtype, the kernels' predicate: pass x in the training calls' dtype, e.g. bf16 under autocast), the neurons ordered most active first (order[i] = the old
    index of new neuron i, ties by index), and twell.choose_training_dense_neurons's choice for the training
    calls' `tokens` rows (the batch's, not the sample's: the terms scale apart; gated: False for a layer
    without an up projection): 0 (TwELL alone), a split, or d_ff (twell's dense path: train with
    dense_neurons 0 and dispatch "auto", whose timing then takes the dense path, or "twell_dense"). Apply
    the order with reorder_neurons_ (order, not its inverse)."""
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        ops._fail("training.hot_first_split", "tokens", "a positive int (the training calls' rows of x)", repr(tokens))
    d_ff, d_model = w_gate.shape
    x2 = x.reshape(-1, d_model)
    g = torch.nn.functional.linear(x2, w_gate.to(x2.dtype))
    _, active = ops.activation_and_mask(g, activation, float(threshold))
    activity = active.sum(0, dtype=torch.int64)
    order = torch.sort(activity, descending=True, stable=True).indices
    spec = _spec(d_model, d_ff, gated, activation, float(threshold) + 0.0, ops.DTYPES.get(x2.dtype, "bf16"))
    n = runtime.choose_training_dense_neurons(spec, tokens, activity[order].tolist(), max(1, x2.shape[0]))
    return order, n


@torch.no_grad()
def reorder_neurons_(order: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor,
                     optimizer: torch.optim.Optimizer | None = None) -> None:
    """Reorders a layer's neurons in place (new neuron i = old neuron order[i]): the rows of w_gate and w_up
    [d_ff, d_model], the columns of w_down [d_model, d_ff] (nn.Linear layouts), their .grad where set, and
    every tensor of the optimizer's state for them shaped like the weight (Adam's moments): the layer
    computes the same function and trains on the same trajectory, up to the fp32 summation order. The
    training split's reparametrization (hot_first_split); not during a step (between optimizer.step() and
    the next forward)."""
    d_ff = w_gate.shape[0]
    if order.dim() != 1 or order.numel() != d_ff or \
            not torch.equal(torch.sort(order.cpu()).values, torch.arange(d_ff)):
        ops._fail("reorder_neurons_", "order", f"a permutation of 0..{d_ff - 1} (1-D, {d_ff} indices)",
                  f"shape {tuple(order.shape)}" + (" with repeated or out-of-range indices" if order.numel() == d_ff else ""))
    moves = []  # every tensor checked before any is moved: a refusal leaves the layer as it was
    for w, dim in ((w_gate, 0), (w_up, 0), (w_down, 1)):
        if w is None:
            continue
        index = order.to(w.device)
        tensors = [w] + ([w.grad] if w.grad is not None else [])
        if optimizer is not None:
            for name, v in optimizer.state.get(w, {}).items():
                if not isinstance(v, torch.Tensor) or v.numel() <= 1:
                    continue  # (a step count)
                if v.shape != w.shape:  # factored or flattened state: its neurons cannot be moved here
                    ops._fail("reorder_neurons_", "optimizer",
                              f"per-element state shaped like the weight {tuple(w.shape)} (Adam's moments)",
                              f"state {name!r} of shape {tuple(v.shape)}")
                tensors.append(v)
        moves += [(t, dim, index) for t in tensors]
    for t, dim, index in moves:
        t.copy_(t.index_select(dim, index))


def recalibrate(release_memory: bool = True) -> None:
    """Forgets dispatch "auto"'s decisions: the next call of each bucket times the three paths again. Call it
    when the density has moved (during training it falls as the L1 term bites). release_memory: also
    drops the training plans and their states, whose backups and scratch grew to the largest overflow
    seen so far (a dense early phase); the next calls make them again at their default sizes (the
    kernels come from the context's cache)."""
    global _generation
    with _lock:
        _paths.clear()
        _path_times.clear()
        if release_memory:
            _generation += 1
            _training_plans.clear()
            _making.clear()


def dispatch_decisions() -> list[dict]:
    """dispatch "auto"'s decisions so far: per bucket (decision_key, device index, d_model, d_ff, gated,
    activation, threshold, dtype, dense_neurons, bit_length(tokens - 1): the bucket holds up to 2**that rows) the path taken
    ("sparse", "twell_dense" or "dense" = PyTorch's) and the measured step times in ms, keyed "twell" (the
    TwELL path: the mean of two steps where its timing stopped early, both over twice the faster dense path's),
    "twell_dense" (absent where twell's dense plan could not be made) and "torch"."""
    with _lock:
        return [{"bucket": k, "path": v, "ms": _path_times.get(k)} for k, v in _paths.items()]
