"""The runtime from Python, without PyTorch: contexts, FFN plans and the dense path over raw device
pointers (what twell.torch builds on; any array library with device pointers can use it).

    ctx = twell.Context()                                   # device 0; kernels from the JIT or bundles
    plan = ctx.plan(d_model=2048, d_ff=5632, max_tokens=16384)
    plan.run(stream, x=..., w_gate=..., w_up=..., w_down=..., y=..., tokens=n)   # device pointers (int)

Every method raises a twell exception (twell.InvalidArgumentError, a ValueError, ...) whose message
names the argument, what was expected and what was given (twell/c_api.h).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
from dataclasses import dataclass

from . import _capi
from ._capi import check, lib
from ._errors import InvalidArgumentError


_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _int(where: str, name: str, value, lo: int, hi: int) -> int:
    """value as a C integer in [lo, hi], or InvalidArgumentError naming it (ctypes would wrap silently)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"twell.{where}: {name}: expected an int, got {value!r}")
    if not lo <= value <= hi:
        raise InvalidArgumentError(f"twell.{where}: {name}: expected {lo}..{hi}, got {value}")
    return value


def _number(where: str, name: str, value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgumentError(f"twell.{where}: {name}: expected a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FfnSpec:
    """One FFN layer (twell/spec.h): x [tokens, d_model]; w_gate, w_up [d_ff, d_model]; w_down
    [d_model, d_ff] (down_layout "out_in", nn.Linear's) or [d_ff, d_model] ("in_out")."""
    d_model: int
    d_ff: int
    gated: bool = True
    activation: str = "relu"   # "relu" (active iff relu(g) > threshold) or "silu" (|silu(g)| > threshold)
    threshold: float = 0.0
    dtype: str = "bf16"        # "bf16" or "fp16"
    down_layout: str = "out_in"
    tile_n: int = 0            # 0: the generator chooses
    slots: int = 0
    consumer: str | None = None  # None, "row_gather" or "token_block"

    def __post_init__(self):
        for name in ("d_model", "d_ff"):
            _int("FfnSpec", name, getattr(self, name), 1, _INT64[1])
        for name in ("tile_n", "slots"):
            _int("FfnSpec", name, getattr(self, name), 0, 2 ** 31 - 1)
        if not isinstance(self.gated, bool):
            raise InvalidArgumentError(f"twell.FfnSpec: gated: expected a bool, got {self.gated!r}")
        _number("FfnSpec", "threshold", self.threshold)

    def _struct(self) -> _capi.FfnSpec:
        return _capi.spec_struct(self.d_model, self.d_ff, gated=self.gated, activation=self.activation,
                                 threshold=self.threshold, dtype=self.dtype, down_layout=self.down_layout,
                                 tile_n=self.tile_n, slots=self.slots, consumer=self.consumer)


@dataclass(frozen=True)
class PlanOptions:
    """twell/plan.h PlanOptions: dispatch "auto" | "sparse" | "dense"; dense_neurons: the hot/cold
    split (a multiple of 64 below d_ff); decode_max_tokens: 0..64, the decode kernels' cut-off;
    decode_fused_max_tokens: 0..32, the cut-off of the one fused decode kernel (0: never);
    backup_capacity: -1 for the default; use_tuning: layouts from the tuning database (Context.tune)
    where the spec leaves them unset, tuning_workload: which tuned workload ("": the newest),
    tuning_dir: the database ("": $TWELL_TUNING_DIR, else beside the kernel cache)."""
    dispatch: str = "auto"
    dense_neurons: int = 0
    decode_max_tokens: int = 64
    decode_fused_max_tokens: int = 32
    backup_capacity: int = -1
    use_tuning: bool = True
    tuning_workload: str = ""
    tuning_dir: str = ""

    def __post_init__(self):
        if not isinstance(self.use_tuning, bool):
            raise InvalidArgumentError(f"twell.PlanOptions: use_tuning: expected True or False, got {self.use_tuning!r}")
        for name in ("tuning_workload", "tuning_dir"):
            if not isinstance(getattr(self, name), (str, os.PathLike)):
                raise InvalidArgumentError(f"twell.PlanOptions: {name}: expected a string, got {getattr(self, name)!r}")
        _int("PlanOptions", "dense_neurons", self.dense_neurons, 0, _INT64[1])
        _int("PlanOptions", "decode_max_tokens", self.decode_max_tokens, 0, _INT64[1])
        _int("PlanOptions", "decode_fused_max_tokens", self.decode_fused_max_tokens, 0, _INT64[1])
        _int("PlanOptions", "backup_capacity", self.backup_capacity, -1, 2 ** 32 - 1)

    def _struct(self) -> _capi.PlanOptions:
        o = _capi.PlanOptions()
        lib().twell_plan_options_init(ctypes.byref(o))
        o.dispatch = _capi.choice(_capi.DISPATCHES, self.dispatch, "dispatch")
        o.dense_neurons, o.decode_max_tokens, o.backup_capacity = self.dense_neurons, self.decode_max_tokens, self.backup_capacity
        o.decode_fused_max_tokens = self.decode_fused_max_tokens
        o.use_tuning = int(self.use_tuning)
        o.tuning_workload = os.fsencode(self.tuning_workload) if self.tuning_workload else None
        o.tuning_dir = os.fsencode(self.tuning_dir) if self.tuning_dir else None
        return o


def tensors_struct(x: int, w_gate: int, w_up: int | None, w_down: int, y: int, ld_x: int = 0, ld_gate: int = 0,
                   ld_up: int = 0, ld_down: int = 0, ld_y: int = 0) -> _capi.FfnTensors:
    """Device pointers (ints) and row strides in elements (0: dense rows)."""
    return _capi.FfnTensors(x, w_gate, w_up or None, w_down, y, ld_x, ld_gate, ld_up, ld_down, ld_y)


class Context:
    """twell::Context: one GPU (device index, or -1 for none), the kernel cache, bundles."""

    def __init__(self, device: int = 0, *, cache_dir: str | None = None, disk_cache: bool = True,
                 target: str | None = None, bundles: tuple[str, ...] = (), jit: str = "if_linked"):
        _int("Context", "device", device, -1, 2 ** 31 - 1)
        if isinstance(bundles, (str, bytes, os.PathLike)):
            raise InvalidArgumentError(f"twell.Context: bundles: expected a list of directories, got the single {bundles!r}")
        for b in bundles:
            if not isinstance(b, (str, os.PathLike)):
                raise InvalidArgumentError(f"twell.Context: bundles: expected directory names, got {b!r}")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise InvalidArgumentError(f"twell.Context: cache_dir: expected a directory name, got {cache_dir!r}")
        o = _capi.ContextOptions()
        l = lib()
        l.twell_context_options_init(ctypes.byref(o))
        o.device = device
        o.cache_dir = os.fsencode(cache_dir) if cache_dir else None
        o.disk_cache = int(bool(disk_cache))
        if target is not None:
            o.target_sm, o.target_arch_specific = _parse_target(target)
        names = (ctypes.c_char_p * max(1, len(bundles)))(*[os.fsencode(b) for b in bundles])
        o.bundles, o.num_bundles = ctypes.cast(names, ctypes.POINTER(ctypes.c_char_p)), len(bundles)
        o.jit = _capi.choice(_capi.JIT_POLICIES, jit, "jit")
        handle = ctypes.c_void_p()
        check(l.twell_context_create(ctypes.byref(o), ctypes.byref(handle)))
        self._handle = handle
        has_gpu, sms = ctypes.c_int(), ctypes.c_int()
        tgt, name, reason = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_char_p()
        check(l.twell_context_info(handle, ctypes.byref(has_gpu), ctypes.byref(sms), ctypes.byref(tgt),
                                   ctypes.byref(name), ctypes.byref(reason)))
        self.device = device
        self.has_gpu = bool(has_gpu.value)
        self.sm_count = sms.value
        self.target = tgt.value.decode()
        self.device_name = name.value.decode()
        self.no_gpu_reason = reason.value.decode()

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _capi._lib is not None:
            _capi._lib.twell_context_destroy(handle)
            self._handle = None

    def load_bundle(self, directory: str) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise InvalidArgumentError(f"twell.Context.load_bundle: directory: expected a directory name, got {directory!r}")
        check(lib().twell_context_load_bundle(self._handle, os.fsencode(directory)))

    def tune(self, spec: FfnSpec, tokens=None, density: float | None = None, weights=None, layer: int | None = None,
             budget_s: float = 60.0, reps: int = 5, write: bool = True, database: str | None = None) -> dict:
        """Autotunes plans of `spec` on this GPU and stores the winner and runner-up per token bucket in the
        tuning database ($TWELL_TUNING_DIR, else beside the kernel cache), which later plans of this spec
        read (twell/tuning.h). tokens: counts, one bucket each (default 1, 16, 256, 16384, 131072);
        density: uniform random inputs with this active fraction (default 0.005), or weights: safetensors
        paths holding layers.<layer>.x and the gate weight. Returns the result (per bucket: winner,
        runner_up, heuristic_ms, dense_ms). Raises NoDeviceError without a GPU, InvalidArgumentError
        naming the field for bad arguments."""
        if not isinstance(spec, FfnSpec):
            raise InvalidArgumentError(f"twell.Context.tune: spec: expected a twell.FfnSpec, got {type(spec).__name__}")
        budget = _number("Context.tune", "budget_s", budget_s)
        if not (0 <= budget < float("inf")):
            raise InvalidArgumentError(f"twell.Context.tune: budget_s: expected a finite number >= 0 (0: no limit), got {budget_s!r}")
        request = {"budget_s": budget, "reps": _int("Context.tune", "reps", reps, 1, 1000), "write": bool(write)}
        if tokens is not None:
            if isinstance(tokens, (str, bytes)):
                raise InvalidArgumentError(f"twell.Context.tune: tokens: expected an int or a list of ints, got {tokens!r}")
            tokens = [tokens] if isinstance(tokens, int) else list(tokens)
            request["tokens"] = [_int("Context.tune", "tokens", t, 1, 1 << 24) for t in tokens]
        if density is not None and weights is not None:
            raise InvalidArgumentError("twell.Context.tune: expected density (random inputs) or weights (a real layer), got both")
        if layer is not None and weights is None:
            raise InvalidArgumentError("twell.Context.tune: layer: expected it with weights, got it alone")
        if density is not None:
            d = _number("Context.tune", "density", density)
            if not 0 < d < 1:
                raise InvalidArgumentError(f"twell.Context.tune: density: expected a fraction in (0, 1), got {density!r}")
            request["density"] = d
        if weights is not None:
            request["weights"] = [os.fspath(w) for w in ([weights] if isinstance(weights, (str, os.PathLike)) else weights)]
            if layer is not None:
                request["layer"] = _int("Context.tune", "layer", layer, 0, 1 << 30)
        if database is not None:
            if not isinstance(database, (str, os.PathLike)):
                raise InvalidArgumentError(f"twell.Context.tune: database: expected a directory name, got {database!r}")
            request["database"] = os.fspath(database)
        out = ctypes.c_char_p()
        check(lib().twell_context_tune(self._handle, ctypes.byref(spec._struct()), json.dumps(request).encode(),
                                       ctypes.byref(out)))
        return json.loads(out.value.decode())

    def plan(self, spec: FfnSpec, max_tokens: int, options: PlanOptions = PlanOptions()) -> "Plan":
        """Generates (or loads) the kernels of `spec` and allocates the workspace for max_tokens rows."""
        return Plan(self, spec, max_tokens, options)

    def dense(self, spec: FfnSpec, max_tokens: int, kernels: str = "cublaslt") -> "DenseFfn":
        """The dense path (twell/dense.h): "cublaslt" GEMMs, "fused_gated_up" (calls of more
        than 64 tokens; cuBLASLt at fewer), or "cublas" (cublasGemmEx
        as PyTorch's F.linear calls it), or "cublaslt_tuned" (cuBLASLt, its first 8 algorithms timed per
        GEMM at the first run: the fastest dense baseline)."""
        return DenseFfn(self, spec, max_tokens, kernels)

    def training_plan(self, spec: FfnSpec, max_tokens: int, backup_capacity: int | None = None,
                      gradients_in_dtype: bool = False, keep_u: bool = True,
                      dw_down_as_weight: bool = False, dispatch: str = "sparse",
                      dense_neurons: int = 0) -> "TrainingPlan":
        """twell::FfnTrainingPlan (twell/training_plan.h): the training forward and backward of `spec`.
        keep_u: the state keeps each entry's u from the forward (4 bytes per TwELL word) so the backward
        reads no Wu row for it (TrainingPlanOptions::keep_u; False: recomputed, the same bits).
        dw_down_as_weight: the backward's dw_down in Wd's own layout ([d_model, d_ff] for an out_in Wd, which
        then needs gradients_in_dtype), not dWd^T (TrainingPlanOptions::dw_down_as_weight).
        dispatch: "sparse" (the TwELL kernels), "dense" (cuBLASLt GEMMs and two elementwise kernels: the same
        function at a dense framework's cost) or "auto" (per power-of-two token bucket, the first forward
        times a step of both and keeps the faster; TrainingPlan.recalibrate() forgets; describe()'s
        "decisions" lists them) (TrainingPlanOptions::dispatch).
        dense_neurons: the hot/cold split of the TwELL path (a multiple of 64 below d_ff; 0: none): the first
        dense_neurons neurons of weights ordered hot-first run on the dense path's GEMMs, the rest on the TwELL
        kernels; a state then serves one backward (TrainingPlanOptions::dense_neurons)."""
        return TrainingPlan(self, spec, max_tokens, backup_capacity, gradients_in_dtype, keep_u, dw_down_as_weight,
                            dispatch, dense_neurons)


class Plan:
    """twell::FfnPlan. One plan's calls must be ordered (one stream, or synchronized)."""

    def __init__(self, context: Context, spec: FfnSpec, max_tokens: int, options: PlanOptions):
        _int("Context.plan", "max_tokens", max_tokens, 1, _INT64[1])
        if not isinstance(spec, FfnSpec) or not isinstance(options, PlanOptions):
            raise InvalidArgumentError(f"twell.Context.plan: expected a twell.FfnSpec and twell.PlanOptions, got "
                                       f"{type(spec).__name__} and {type(options).__name__}")
        handle = ctypes.c_void_p()
        check(lib().twell_plan_create(context._handle, ctypes.byref(spec._struct()), max_tokens,
                                      ctypes.byref(options._struct()), ctypes.byref(handle)))
        self._handle = handle
        self.context, self.spec, self.options, self.max_tokens = context, spec, options, max_tokens
        self._run = lib().twell_plan_run

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _capi._lib is not None:
            _capi._lib.twell_plan_destroy(handle)
            self._handle = None

    def run_struct(self, stream: int, tensors: _capi.FfnTensors, tokens: int, decision_key: int = 0) -> None:
        """run() with a prepared twell_ffn_tensors (the fast path of twell.torch: its arguments are
        checked there)."""
        status = self._run(self._handle, stream, ctypes.byref(tensors), tokens, decision_key)
        if status:
            check(status)

    def run(self, stream: int, *, x: int, w_gate: int, w_up: int | None, w_down: int, y: int, tokens: int,
            ld_x: int = 0, ld_gate: int = 0, ld_up: int = 0, ld_down: int = 0, ld_y: int = 0,
            decision_key: int = 0) -> None:
        """y = FFN(x) for `tokens` rows, stream-ordered (stream: a cudaStream_t as int, 0 = default)."""
        _int("Plan.run", "stream", stream, 0, 2 ** 64 - 1)
        _int("Plan.run", "tokens", tokens, 0, _INT64[1])
        _int("Plan.run", "decision_key", decision_key, 0, 2 ** 64 - 1)
        for name, value in (("x", x), ("w_gate", w_gate), ("w_down", w_down), ("y", y)) + ((("w_up", w_up),) if w_up is not None else ()):
            _int("Plan.run", name, value, 0, 2 ** 64 - 1)
        for name, value in (("ld_x", ld_x), ("ld_gate", ld_gate), ("ld_up", ld_up), ("ld_down", ld_down), ("ld_y", ld_y)):
            _int("Plan.run", name, value, 0, _INT64[1])
        self.run_struct(stream, tensors_struct(x, w_gate, w_up, w_down, y, ld_x, ld_gate, ld_up, ld_down, ld_y),
                        tokens, decision_key)

    def last_path(self) -> str:
        p = ctypes.c_char_p()
        check(lib().twell_plan_last_path(self._handle, ctypes.byref(p)))
        return p.value.decode()

    def recalibrate(self) -> None:
        check(lib().twell_plan_recalibrate(self._handle))

    def describe(self) -> dict:
        """Spec, layout, target and each kernel's report (name, kind, cache, compile_ms, ...)."""
        p = ctypes.c_char_p()
        check(lib().twell_plan_describe(self._handle, ctypes.byref(p)))
        return json.loads(p.value.decode())

    def last_overflow(self, stream: int = 0) -> dict:
        r = _capi.OverflowReport()
        check(lib().twell_plan_last_overflow(self._handle, stream, ctypes.byref(r)))
        return {"overflowing_tile_rows": r.overflowing_tile_rows, "backup_capacity": r.backup_capacity,
                "recomputed": bool(r.recomputed)}

    def neuron_activity(self, stream: int = 0) -> tuple[list[int], int]:
        """(activity per TwELL neuron over the last run's rows, that row count); synchronizes."""
        n = self.spec.d_ff - self.options.dense_neurons
        buf = (ctypes.c_uint64 * n)()
        rows = ctypes.c_int64()
        check(lib().twell_plan_neuron_activity(self._handle, stream, buf, n, ctypes.byref(rows)))
        return list(buf), rows.value


class DenseFfn:
    """twell::DenseFfn: the same FFN through cuBLASLt (or the fused gate + up kernel above 64 tokens)."""

    def __init__(self, context: Context, spec: FfnSpec, max_tokens: int, kernels: str):
        handle = ctypes.c_void_p()
        check(lib().twell_dense_create(context._handle, ctypes.byref(spec._struct()), max_tokens,
                                       _capi.choice(_capi.DENSE_KERNELS, kernels, "kernels"), ctypes.byref(handle)))
        self._handle, self.context, self.spec = handle, context, spec

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _capi._lib is not None:
            _capi._lib.twell_dense_destroy(handle)
            self._handle = None

    def run_struct(self, stream: int, tensors: _capi.FfnTensors, tokens: int) -> None:
        check(lib().twell_dense_run(self._handle, stream, ctypes.byref(tensors), tokens))


class TrainingState:
    """twell::FfnTrainingState: what one forward keeps for its backward (the TwELL matrix of act(g), or on the
    dense path g and u, which its one backward overwrites)."""

    def __init__(self, plan: "TrainingPlan"):
        handle = ctypes.c_void_p()
        check(lib().twell_training_state_create(plan._handle, ctypes.byref(handle)))
        self._handle, self.plan = handle, plan

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _capi._lib is not None:
            _capi._lib.twell_training_state_destroy(handle)
            self._handle = None


class TrainingPlan:
    """twell::FfnTrainingPlan: forward(x -> y, each row's sum |h|) into a TrainingState, then backward
    (dx, dWg, dWu, dWd^T, or dWd as the weight with dw_down_as_weight). Pointers are device addresses as
    ints; one plan's calls must be ordered."""

    def __init__(self, context: Context, spec: FfnSpec, max_tokens: int, backup_capacity: int | None,
                 gradients_in_dtype: bool, keep_u: bool = True, dw_down_as_weight: bool = False,
                 dispatch: str = "sparse", dense_neurons: int = 0):
        _int("Context.training_plan", "max_tokens", max_tokens, 1, _INT64[1])
        _int("Context.training_plan", "dense_neurons", dense_neurons, 0, _INT64[1])
        if backup_capacity is not None:
            _int("Context.training_plan", "backup_capacity", backup_capacity, 0, 2 ** 32 - 1)
        if not isinstance(gradients_in_dtype, bool):
            raise InvalidArgumentError(f"twell.Context.training_plan: gradients_in_dtype: expected a bool, got "
                                       f"{gradients_in_dtype!r}")
        if not isinstance(keep_u, bool):
            raise InvalidArgumentError(f"twell.Context.training_plan: keep_u: expected a bool, got {keep_u!r}")
        if not isinstance(dw_down_as_weight, bool):
            raise InvalidArgumentError(f"twell.Context.training_plan: dw_down_as_weight: expected a bool, got "
                                       f"{dw_down_as_weight!r}")
        dispatch_flags = {"sparse": 0, "dense": 8, "auto": 16}  # TWELL_TRAINING_DISPATCH_* (c_api.h)
        if not isinstance(dispatch, str) or dispatch not in dispatch_flags:
            raise InvalidArgumentError(f"twell.Context.training_plan: dispatch: expected 'sparse', 'dense' or 'auto', got "
                                       f"{dispatch!r}")
        # TWELL_TRAINING_* (c_api.h)
        flags = (1 if gradients_in_dtype else 0) | (0 if keep_u else 2) | (4 if dw_down_as_weight else 0) | \
            dispatch_flags[dispatch]
        handle = ctypes.c_void_p()
        check(lib().twell_training_plan_create_split(context._handle, ctypes.byref(spec._struct()), max_tokens,
                                                     -1 if backup_capacity is None else backup_capacity,
                                                     flags, dense_neurons, ctypes.byref(handle)))
        self._handle = handle
        self.context, self.spec, self.max_tokens = context, spec, max_tokens
        self._forward, self._backward = lib().twell_training_forward_keyed, lib().twell_training_backward

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _capi._lib is not None:
            _capi._lib.twell_training_plan_destroy(handle)
            self._handle = None

    def make_state(self) -> TrainingState:
        return TrainingState(self)

    def describe(self) -> dict:
        p = ctypes.c_char_p()
        check(lib().twell_training_plan_describe(self._handle, ctypes.byref(p)))
        return json.loads(p.value.decode())

    def recalibrate(self) -> None:
        """Forgets dispatch "auto"'s decisions: the next forward of each bucket times both paths again."""
        check(lib().twell_training_plan_recalibrate(self._handle))

    def forward_struct(self, stream: int, tensors: _capi.FfnTensors, tokens: int, state: TrainingState,
                       row_l1: int | None, decision_key: int = 0) -> None:
        """forward() with a prepared twell_ffn_tensors (twell.torch checks the arguments first); decision_key:
        dispatch "auto"'s key (layers of one shape sharing the plan decide apart), an unsigned 64-bit int."""
        if decision_key and not 0 <= decision_key < 2 ** 64:
            raise InvalidArgumentError(f"twell.TrainingPlan.forward_struct: decision_key: expected 0..2**64 - 1, got "
                                       f"{decision_key}")
        status = self._forward(self._handle, stream, ctypes.byref(tensors), tokens, state._handle, row_l1, decision_key)
        if status:
            check(status)

    def backward_struct(self, stream: int, tensors: _capi.FfnTensors, dy: int, ld_dy: int, tokens: int,
                        state: TrainingState, gradients: _capi.FfnGradients, l1_coefficient: float, l1_tokens: int,
                        l1_weight: int | None) -> None:
        status = self._backward(self._handle, stream, ctypes.byref(tensors), dy, ld_dy, tokens, state._handle,
                                ctypes.byref(gradients), l1_coefficient, l1_tokens, l1_weight)
        if status:
            check(status)


def tune(spec: FfnSpec, device: int = 0, **kwargs) -> dict:
    """Context(device).tune(spec, **kwargs): autotuning into the tuning database (Context.tune)."""
    return Context(device).tune(spec, **kwargs)


def _choose(name: str, spec: FfnSpec, tokens: int, sorted_activity, rows: int) -> int:
    _int(name, "tokens", tokens, 1, _INT64[1])
    _int(name, "rows", rows, 1, _INT64[1])
    counts = [_int(name, "sorted_activity[i]", int(c), 0, 2 ** 64 - 1) for c in sorted_activity]
    buf = (ctypes.c_uint64 * max(1, len(counts)))(*counts)
    out = ctypes.c_int64()
    check(getattr(lib(), "twell_" + name)(ctypes.byref(spec._struct()), tokens, buf, len(counts), rows, ctypes.byref(out)))
    return out.value


def choose_dense_neurons(spec: FfnSpec, tokens: int, sorted_activity, rows: int) -> int:
    """The hot/cold split with the least predicted time (twell/neuron_order.h): sorted_activity holds
    d_ff activity counts over `rows` calibration rows, sorted descending."""
    return _choose("choose_dense_neurons", spec, tokens, sorted_activity, rows)


def choose_training_dense_neurons(spec: FfnSpec, tokens: int, sorted_activity, rows: int) -> int:
    """The training step's split with the least predicted time (twell/neuron_order.h's
    TrainingSplitCostModel), the same arguments: 0 (the TwELL path alone), a split
    (Context.training_plan(dense_neurons=)), or d_ff (twell's dense training path)."""
    return _choose("choose_training_dense_neurons", spec, tokens, sorted_activity, rows)


def version() -> str:
    return lib().twell_version().decode()


def jit_available() -> bool:
    return bool(lib().twell_jit_available())


def _parse_target(target: str) -> tuple[int, int]:
    m = re.fullmatch(r"sm_([1-9][0-9]*)(a?)", target) if isinstance(target, str) else None
    if m is None:
        raise InvalidArgumentError(f"twell.Context: target: expected 'sm_<digits>' or 'sm_<digits>a' (e.g. sm_90a, sm_80), "
                                   f"got {target!r}")
    return int(m.group(1)), int(bool(m.group(2)))
