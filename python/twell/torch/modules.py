"""twell.torch.SparseGatedMLP, the drop-in MLP, and sparsify_, which puts it into a Llama- or
Qwen-style model in place.

    model = AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.bfloat16).cuda()
    twell.torch.sparsify_(model)          # every gate_proj/up_proj/down_proj MLP -> SparseGatedMLP
    logits = model(ids).logits            # the same function, the FFNs through twell
"""
from __future__ import annotations

import itertools
import statistics

import torch
from torch import Tensor, nn

from .. import runtime
from .._errors import InvalidArgumentError
from . import _plans, ops
from . import training as training_ops
from .timing import cuda_event_times, l2_eviction

_decision_keys = itertools.count(1)


class SparseGatedMLP(nn.Module):
    """y = down_proj(act(gate_proj(x)) * up_proj(x)) (or down_proj(act(gate_proj(x))) without
    up_proj) through twell's sparse kernels, with the nn.Linear modules' own parameters (shared, not
    copied: the state_dict keys and .to() stay those of the MLP it replaces).

    x [..., d_model], bf16 or fp16 like the weights, on a CUDA device. Under torch.autocast with fp32
    weights, x and the weights are cast to the autocast dtype (a copy of the weights per call: convert
    the model instead). Calls under torch.no_grad / inference_mode skip the custom-op dispatcher (tens
    of microseconds of host time); calls that need autograd go through it. Options (twell.torch.ops):
      threshold   the activation's cut-off (0 for a ReLU-trained model: the exact function)
      activation  "relu" (active iff relu(g) > threshold) or "silu" (|silu(g)| > threshold > 0)
      dispatch    "auto" (per token bucket, the fastest of twell's TwELL path, twell's dense path
                  and PyTorch's own dense F.linear chain, timed on the first call of the bucket:
                  keeps the layer never slower than PyTorch dense), "sparse", "dense" (twell's)
      decode_max_tokens  calls of at most this many tokens take the decode kernels (0..64)
      dense_neurons      the hot/cold split: the first dense_neurons neurons run dense; set it with
                         calibrate_split(), which also orders the neurons hot-first
      max_tokens  the largest plan workspace (rows); longer inputs run in chunks
      down_layout "in_out": store down_proj.weight with contiguous columns (set_down_layout_; faster
                  decoding), "out_in": contiguous rows (nn.Linear's), None (default): leave it as it is
    Layers of one shape share a plan (twell.torch._plans); each layer keeps its own dispatch
    decisions (decision_key).
    Training (eager, grad enabled) runs twell.torch.sparse_ffn_train (with dense_neurons: its training
    split): the forward keeps its TwELL state for the sparse backward, and `self.l1` holds this call's L1
    term sum |h| / tokens (a scalar in the graph: add l1_coefficient * sum(m.l1 for m in layers) to the
    loss); None otherwise (no_grad, torch.compile: those train through the operators' backward, without an
    L1 term). For training, twell.torch.training.hot_first_split and reorder_neurons_ (which also moves the
    optimizer's moments) choose and apply the split with the training step's cost model. In training, dispatch "dense" is PyTorch's own autograd, "auto" the fastest whole step of twell's
    TwELL path, twell's dense path and PyTorch's.
    Inference advice above (convert the model) aside, train with fp32 master weights under autocast: the
    per-call casts pass the gradients on.
    """

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear | None, down_proj: nn.Linear, *,
                 activation: str = "relu", threshold: float = 0.0, dispatch: str = "auto", decode_max_tokens: int = 64,
                 dense_neurons: int = 0, max_tokens: int = ops.DEFAULT_MAX_TOKENS, down_layout: str | None = None):
        super().__init__()
        if down_layout not in (None, "in_out", "out_in"):
            raise InvalidArgumentError(f"twell.torch.SparseGatedMLP: down_layout: expected None, 'in_out' or 'out_in', "
                                       f"got {down_layout!r}")
        for name, linear in (("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj)):
            if linear is None and name == "up_proj":
                continue
            if not isinstance(linear, nn.Linear):
                raise InvalidArgumentError(f"twell.torch.SparseGatedMLP: {name}: expected an nn.Linear, got {type(linear).__name__}")
            if linear.bias is not None:
                raise InvalidArgumentError(f"twell.torch.SparseGatedMLP: {name}: expected a Linear without bias "
                                           "(twell's FFN has none), got one with a bias")
        d_ff, d_model = gate_proj.weight.shape
        if up_proj is not None and tuple(up_proj.weight.shape) != (d_ff, d_model):
            raise InvalidArgumentError(f"twell.torch.SparseGatedMLP: up_proj: expected weight shape {(d_ff, d_model)} "
                                       f"(gate_proj's), got {tuple(up_proj.weight.shape)}")
        if tuple(down_proj.weight.shape) != (d_model, d_ff):
            raise InvalidArgumentError(f"twell.torch.SparseGatedMLP: down_proj: expected weight shape {(d_model, d_ff)}, "
                                       f"got {tuple(down_proj.weight.shape)}")
        ops.check_options("torch.SparseGatedMLP", d_ff, activation, threshold, dispatch, decode_max_tokens, dense_neurons,
                          max_tokens)
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.d_model, self.d_ff = d_model, d_ff
        self.activation, self.threshold = activation, float(threshold)
        self.dispatch, self.decode_max_tokens = dispatch, decode_max_tokens
        self.dense_neurons, self.max_tokens = dense_neurons, max_tokens
        self.decision_key = next(_decision_keys)
        # dispatch "auto": per token bucket, "twell" or "torch" (_path), and the times that chose it.
        self.paths: dict[tuple, str] = {}
        self.path_times: dict[tuple, dict[str, float]] = {}
        self.l1: Tensor | None = None  # the last training call's L1 term (see the class documentation)
        if down_layout is not None:
            self.set_down_layout_(down_layout)

    @torch.no_grad()
    def set_down_layout_(self, layout: str) -> "SparseGatedMLP":
        """Stores down_proj.weight [d_model, d_ff] in place with contiguous columns ("in_out": each neuron's
        d_model values one contiguous run, which the decode kernels read in 16-byte pieces: at 1-16 tokens and
        0.5% density 1.5-1.9x PyTorch dense, against 1.0-1.56x with "out_in", bench/README.md v73) or contiguous rows ("out_in", nn.Linear's).
        The same Parameter, shape and values: the state_dict, F.linear (dispatch "auto"'s PyTorch path) and
        optimizers see the same tensor; training copies an in_out weight to rows per call, so train in
        out_in. The new storage replaces the old one (both exist during the call). Returns self."""
        if layout not in ("in_out", "out_in"):
            raise InvalidArgumentError(f"twell.torch.SparseGatedMLP.set_down_layout_: layout: expected 'in_out' or "
                                       f"'out_in', got {layout!r}")
        w = self.down_proj.weight
        if ops.down_layout_of(w)[0] != layout:
            w.data = w.data.t().contiguous().t() if layout == "in_out" else w.data.contiguous()
            self.paths.clear()  # dispatch "auto"'s choices were timed in the other layout
            self.path_times.clear()
        return self

    @classmethod
    def from_mlp(cls, mlp: nn.Module, *, threshold: float | None = None, **options) -> "SparseGatedMLP":
        """From a module with gate_proj, up_proj, down_proj (nn.Linear) and act_fn (a Llama/Qwen MLP).
        Its activation must be ReLU; a SiLU one (or a ReLU with a cut-off) needs `threshold`."""
        for name in ("gate_proj", "down_proj"):
            if not isinstance(getattr(mlp, name, None), nn.Linear):
                raise InvalidArgumentError(f"twell.torch: {type(mlp).__name__}.{name}: expected an nn.Linear, got "
                                           f"{type(getattr(mlp, name, None)).__name__}")
        if threshold is not None and (not isinstance(threshold, (int, float)) or isinstance(threshold, bool)):
            raise InvalidArgumentError(f"twell.torch: threshold: expected a number, got {threshold!r}")
        activation = _activation_of(mlp)
        if activation is None:
            raise InvalidArgumentError(
                f"twell.torch: {type(mlp).__name__}.act_fn: expected ReLU (or SiLU with a threshold), got "
                f"{type(getattr(mlp, 'act_fn', None)).__name__}: twell's kernels skip the neurons whose activation is "
                "zero, so the MLP must be sparsity-trained with a ReLU gate")
        if activation == "silu" and threshold is None:
            raise InvalidArgumentError(
                f"twell.torch: {type(mlp).__name__}.act_fn: the MLP's activation is SiLU, which is never exactly zero; "
                "twell computes it only with a magnitude threshold (threshold=..., CATS/TEAL-style pruning, which "
                "changes the model's function): pass threshold > 0, or use a ReLU-trained model")
        return cls(mlp.gate_proj, getattr(mlp, "up_proj", None), mlp.down_proj, activation=activation,
                   threshold=0.0 if threshold is None else threshold, **options)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation}, threshold={self.threshold}, "
                f"dispatch={self.dispatch}, dense_neurons={self.dense_neurons}")

    def _operands(self, x: Tensor):
        weights = [self.gate_proj.weight, self.up_proj.weight if self.up_proj is not None else None, self.down_proj.weight]
        if x.device.type == "cuda" and torch.is_autocast_enabled("cuda") and weights[0].dtype == torch.float32:
            dtype = torch.get_autocast_dtype("cuda")
            weights = [w.to(dtype) if w is not None else None for w in weights]
            x = x.to(dtype)
        return x, weights

    def forward(self, x: Tensor) -> Tensor:
        x, (w_gate, w_up, w_down) = self._operands(x)
        weights = [w for w in (w_gate, w_up, w_down) if w is not None]
        # Plain tensors outside torch.compile: this call runs now (no tracing), so it may time paths
        # and skip the dispatcher.
        eager = type(x) is torch.Tensor and x.device.type == "cuda" and not torch.compiler.is_compiling()
        with torch.autocast("cuda", enabled=False):
            training = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights))
            if eager and training:
                # Training: twell's forward keeps its TwELL state for the sparse backward, and the L1 term
                # comes with y (dispatch "auto": per token bucket the fastest whole step: twell's two paths, PyTorch).
                y, self.l1 = training_ops.sparse_ffn_train(x, w_gate, w_up, w_down, self.activation, self.threshold,
                                                           dispatch=self.dispatch, decision_key=self.decision_key,
                                                           dense_neurons=self.dense_neurons)
                return y
            self.l1 = None
            if eager and self.dispatch == "auto" and self._path(x, w_gate, w_up, w_down) == "torch":
                return ops.dense_forward(x, w_gate, w_up, w_down, self.activation, self.threshold)
            args = (self.activation, self.threshold, self.dispatch, self.decode_max_tokens, self.dense_neurons,
                    self.max_tokens, self.decision_key)
            if eager and not training:
                return ops.forward_eager(x, w_gate, w_up, w_down, *args)
            if w_up is None:
                return ops.sparse_ffn(x, w_gate, w_down, *args)
            return ops.sparse_gated_ffn(x, w_gate, w_up, w_down, *args)

    def _path(self, x: Tensor, w_gate: Tensor, w_up: Tensor | None, w_down: Tensor) -> str:
        """dispatch "auto" per token bucket: "twell" (the plan, itself choosing among its TwELL and
        dense kernels) or "torch" (PyTorch's dense F.linear chain, what the user ran before), timed on
        this call's inputs the first time (median of 3 after a warm-up, GPU time by CUDA events with the
        host's overhead hidden, as under CUDA graphs, and L2 overwritten before each call so that the
        weights come from DRAM: timing.cuda_event_times, l2_eviction; synchronizes),
        so that the layer is never slower than PyTorch dense beyond that timing's noise."""
        tokens = x.numel() // self.d_model if self.d_model else 0
        bucket = _plans.token_bucket(tokens, self.decode_max_tokens)
        path = self.paths.get(bucket)
        if path is not None or tokens == 0:
            return path or "twell"
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"twell.torch.SparseGatedMLP: the first call of {tokens} tokens during CUDA-graph capture: "
                               "dispatch 'auto' times twell against PyTorch dense on that call, which synchronizes; run "
                               "the same call once before capture (warm-up)")
        args = (self.activation, self.threshold, "auto", self.decode_max_tokens, self.dense_neurons, self.max_tokens,
                self.decision_key)
        candidates = {"twell": lambda: ops.forward_eager(x, w_gate, w_up, w_down, *args),
                      "torch": lambda: ops.dense_forward(x, w_gate, w_up, w_down, self.activation, self.threshold)}
        with torch.no_grad():
            evict = l2_eviction(x.device)  # each timed call reads its weights from DRAM, as in a model (v71)
            times = {name: _median_ms(fn, before_each=evict) for name, fn in candidates.items()}
        self.paths[bucket] = path = min(times, key=times.get)
        self.path_times[bucket] = times
        return path

    def recalibrate(self) -> None:
        """Forgets dispatch "auto"'s choices (this module's, and its plan's for this layer): the next
        call of each token bucket times the paths again (after fine-tuning, or on new data)."""
        self.paths.clear()
        self.path_times.clear()
        self.decision_key = next(_decision_keys)

    def reference(self, x: Tensor) -> Tensor:
        """The same function with PyTorch dense ops (the baseline)."""
        x, (w_gate, w_up, w_down) = self._operands(x)
        return ops.dense_reference(x, w_gate, w_up, w_down, self.activation, self.threshold)

    @torch.no_grad()
    def neuron_activity(self, x: Tensor) -> tuple[Tensor, int]:
        """(per neuron of d_ff, the number of rows of x in which it is active; the row count), from
        twell's TwELL matrix of x (at most max_tokens rows are used)."""
        x, (w_gate, w_up, w_down) = self._operands(x)
        op = "sparse_gated_ffn" if w_up is not None else "sparse_ffn"
        ops.check_args(op, x, w_gate, w_up, w_down, self.activation, self.threshold, "sparse", 0, 0, self.max_tokens)
        if x.device.type != "cuda":
            raise InvalidArgumentError(f"twell.torch.SparseGatedMLP.neuron_activity: x: expected a CUDA tensor, got one on {x.device}")
        x2 = x.reshape(-1, self.d_model)[: self.max_tokens].contiguous()
        down_layout, ld_down = ops.down_layout_of(w_down)
        spec = runtime.FfnSpec(self.d_model, self.d_ff, gated=w_up is not None, activation=self.activation,
                               threshold=self.threshold, dtype=ops.DTYPES[x.dtype], down_layout=down_layout)
        options = runtime.PlanOptions(dispatch="sparse", decode_max_tokens=0)
        plan = _plans.context(x.device).plan(spec, max(1, x2.shape[0]), options)
        y = torch.empty_like(x2)
        stream = ops.stream_handle(x.device)
        for _ in range(2):
            plan.run(stream, x=x2.data_ptr(), w_gate=w_gate.data_ptr(), w_up=w_up.data_ptr() if w_up is not None else None,
                     w_down=w_down.data_ptr(), y=y.data_ptr(), tokens=x2.shape[0], ld_gate=w_gate.stride(0),
                     ld_up=w_up.stride(0) if w_up is not None else 0, ld_down=ld_down)
            # A tile-row that found the backup full has unknown nonzeros: last_overflow sizes the backup
            # and the second run holds every tile-row.
            if not plan.last_overflow(stream)["recomputed"]:
                break
        activity, rows = plan.neuron_activity(stream)
        return torch.tensor(activity, dtype=torch.int64), rows

    @torch.no_grad()
    def calibrate_split(self, x: Tensor, tokens: int | None = None) -> int:
        """The hot/cold split from calibration inputs x (e.g. a few thousand real tokens): orders the
        neurons hot-first (permuting the rows of gate_proj and up_proj and the columns of down_proj in
        place: the MLP computes the same function, up to the fp32 summation order) and sets
        dense_neurons to the split twell's cost model predicts fastest for batches of `tokens` rows
        (default: x's row count). Returns dense_neurons. For inference: the inference cost model, and the
        weights' .grad and any optimizer state stay where they were; in training use
        twell.torch.training.hot_first_split and reorder_neurons_ (the training step's model, and the
        optimizer's moments moved with their neurons), then set dense_neurons."""
        activity, rows = self.neuron_activity(x)
        order = torch.sort(activity, descending=True, stable=True).indices
        spec = runtime.FfnSpec(self.d_model, self.d_ff, gated=self.up_proj is not None, activation=self.activation,
                               threshold=self.threshold, dtype=ops.DTYPES.get(self.gate_proj.weight.dtype, "bf16"))
        n = runtime.choose_dense_neurons(spec, tokens or x.numel() // self.d_model, activity[order].tolist(), rows)
        device_order = order.to(self.gate_proj.weight.device)
        self.gate_proj.weight.copy_(self.gate_proj.weight.index_select(0, device_order))
        if self.up_proj is not None:
            self.up_proj.weight.copy_(self.up_proj.weight.index_select(0, device_order))
        self.down_proj.weight.copy_(self.down_proj.weight.index_select(1, device_order))
        self.dense_neurons = n
        return n


def _median_ms(fn, reps: int = 3, before_each=None) -> float:
    fn()  # warm-up: kernels load, the plan's own per-bucket calibration runs
    return statistics.median(cuda_event_times(fn, reps, before_each))


def _activation_of(mlp: nn.Module) -> str | None:
    act = getattr(mlp, "act_fn", None)
    if isinstance(act, nn.ReLU):
        return "relu"
    if isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU"):
        return "silu"
    return None


def _is_mlp(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))


def sparsify_(model: nn.Module, *, threshold: float | None = None, **options) -> nn.Module:
    """Replaces, in place, every MLP of `model` with gate_proj, up_proj, down_proj and act_fn (Llama,
    Qwen, Mistral style, and bench/sparse_lm's model) by a SparseGatedMLP over the same parameters;
    returns the model. options: SparseGatedMLP's (dispatch, decode_max_tokens, max_tokens, ...).
    Refuses (InvalidArgumentError, nothing replaced) a model without such MLPs, or whose MLP
    activation is not ReLU unless `threshold` is given (SiLU: threshold > 0, which changes the
    function: CATS/TEAL-style pruning)."""
    found, outer = [], []
    for name, m in model.named_modules(remove_duplicate=False):
        if not _is_mlp(m) or isinstance(m, SparseGatedMLP) or any(name.startswith(o + ".") for o in outer if o):
            continue
        found.append((name, m))
        outer.append(name)
    if not found:
        done = sum(isinstance(m, SparseGatedMLP) for m in model.modules())
        raise InvalidArgumentError(f"twell.torch.sparsify_: model: expected MLP modules with gate_proj, up_proj and "
                                   f"down_proj (nn.Linear), found none in {type(model).__name__}"
                                   + (f" (it holds {done} SparseGatedMLP: already sparsified)" if done else ""))
    if found[0][0] == "":
        raise InvalidArgumentError("twell.torch.sparsify_: model: the model is itself an MLP and cannot be replaced in "
                                   "place; use twell.torch.SparseGatedMLP.from_mlp(model)")
    # One replacement per module object: an MLP registered under two names stays one (tied) module.
    made: dict[int, SparseGatedMLP] = {}
    for _, m in found:
        if id(m) not in made:
            made[id(m)] = SparseGatedMLP.from_mlp(m, threshold=threshold, **options)
    replacements = [(name, made[id(m)]) for name, m in found]
    for name, new in replacements:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    return model
