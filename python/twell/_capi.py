"""ctypes bindings of twell's C API (runtime/include/twell/c_api.h): the structs, the function
signatures, the library search, and status codes turned into exceptions.

ctypes rather than a compiled extension: the C API is the stable boundary, so one package works
with any CPython 3 and any PyTorch 2.x (nothing is built against either), and the shared libraries
are exactly the ones the CMake build makes (README, "PyTorch").
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import threading

from ._errors import InvalidArgumentError, error_for_status

C_API_VERSION = 7  # TWELL_C_API_VERSION this module was written for

# Enum values of c_api.h.
DTYPES = {"bf16": 0, "fp16": 1}
ACTIVATIONS = {"relu": 0, "silu": 1}
WEIGHT_LAYOUTS = {"out_in": 0, "in_out": 1}
CONSUMERS = {None: -1, "row_gather": 0, "token_block": 1}
DISPATCHES = {"auto": 0, "sparse": 1, "dense": 2}
DENSE_KERNELS = {"cublaslt": 0, "fused_gated_up": 1, "cublas": 2, "cublaslt_tuned": 3}
JIT_POLICIES = {"if_linked": 0, "never": 1}


class ContextOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("device", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("disk_cache", ctypes.c_int),
        ("target_sm", ctypes.c_int),
        ("target_arch_specific", ctypes.c_int),
        ("bundles", ctypes.POINTER(ctypes.c_char_p)),
        ("num_bundles", ctypes.c_size_t),
        ("jit", ctypes.c_int),
    ]


class FfnSpec(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("d_model", ctypes.c_int64),
        ("d_ff", ctypes.c_int64),
        ("gated", ctypes.c_int),
        ("activation", ctypes.c_int),
        ("threshold", ctypes.c_float),
        ("dtype", ctypes.c_int),
        ("down_layout", ctypes.c_int),
        ("tile_n", ctypes.c_int),
        ("slots", ctypes.c_int),
        ("consumer", ctypes.c_int),
        ("gate_cluster_m", ctypes.c_int),
    ]


class PlanOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backup_capacity", ctypes.c_int64),
        ("dispatch", ctypes.c_int),
        ("dense_neurons", ctypes.c_int64),
        ("decode_max_tokens", ctypes.c_int64),
        ("use_tuning", ctypes.c_int),
        ("tuning_workload", ctypes.c_char_p),
        ("tuning_dir", ctypes.c_char_p),
        ("decode_fused_max_tokens", ctypes.c_int64),
    ]


class FfnTensors(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p),
        ("w_gate", ctypes.c_void_p),
        ("w_up", ctypes.c_void_p),
        ("w_down", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("ld_x", ctypes.c_int64),
        ("ld_gate", ctypes.c_int64),
        ("ld_up", ctypes.c_int64),
        ("ld_down", ctypes.c_int64),
        ("ld_y", ctypes.c_int64),
    ]


class FfnGradients(ctypes.Structure):
    _fields_ = [
        ("dx", ctypes.c_void_p),
        ("dw_gate", ctypes.c_void_p),
        ("dw_up", ctypes.c_void_p),
        ("dw_down", ctypes.c_void_p),
        ("ld_dx", ctypes.c_int64),
        ("ld_dw_gate", ctypes.c_int64),
        ("ld_dw_up", ctypes.c_int64),
        ("ld_dw_down", ctypes.c_int64),
    ]


class OverflowReport(ctypes.Structure):
    _fields_ = [
        ("overflowing_tile_rows", ctypes.c_uint32),
        ("backup_capacity", ctypes.c_uint32),
        ("recomputed", ctypes.c_int),
    ]


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_STATUS = ctypes.c_int
_SIGNATURES = {
    "twell_c_api_version": (ctypes.c_int, []),
    "twell_version": (ctypes.c_char_p, []),
    "twell_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "twell_last_error": (ctypes.c_char_p, []),
    "twell_jit_available": (ctypes.c_int, []),
    "twell_context_options_init": (None, [ctypes.POINTER(ContextOptions)]),
    "twell_ffn_spec_init": (None, [ctypes.POINTER(FfnSpec)]),
    "twell_plan_options_init": (None, [ctypes.POINTER(PlanOptions)]),
    "twell_context_create": (_STATUS, [ctypes.POINTER(ContextOptions), ctypes.POINTER(_P)]),
    "twell_context_destroy": (_STATUS, [_P]),
    "twell_context_info": (_STATUS, [_P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.POINTER(ctypes.c_char_p)]),
    "twell_context_load_bundle": (_STATUS, [_P, ctypes.c_char_p]),
    "twell_context_tune": (_STATUS, [_P, _P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]),
    "twell_plan_create": (_STATUS, [_P, ctypes.POINTER(FfnSpec), _I64, ctypes.POINTER(PlanOptions), ctypes.POINTER(_P)]),
    "twell_plan_destroy": (_STATUS, [_P]),
    "twell_plan_run": (_STATUS, [_P, _P, ctypes.POINTER(FfnTensors), _I64, ctypes.c_uint64]),
    "twell_plan_max_tokens": (_STATUS, [_P, ctypes.POINTER(_I64)]),
    "twell_plan_last_path": (_STATUS, [_P, ctypes.POINTER(ctypes.c_char_p)]),
    "twell_plan_recalibrate": (_STATUS, [_P]),
    "twell_plan_describe": (_STATUS, [_P, ctypes.POINTER(ctypes.c_char_p)]),
    "twell_plan_last_overflow": (_STATUS, [_P, _P, ctypes.POINTER(OverflowReport)]),
    "twell_plan_neuron_activity": (_STATUS, [_P, _P, ctypes.POINTER(ctypes.c_uint64), _I64, ctypes.POINTER(_I64)]),
    "twell_choose_dense_neurons": (_STATUS, [ctypes.POINTER(FfnSpec), _I64, ctypes.POINTER(ctypes.c_uint64), _I64, _I64,
                                             ctypes.POINTER(_I64)]),
    "twell_choose_training_dense_neurons": (_STATUS, [ctypes.POINTER(FfnSpec), _I64, ctypes.POINTER(ctypes.c_uint64), _I64,
                                                      _I64, ctypes.POINTER(_I64)]),
    "twell_dense_create": (_STATUS, [_P, ctypes.POINTER(FfnSpec), _I64, ctypes.c_int, ctypes.POINTER(_P)]),
    "twell_dense_destroy": (_STATUS, [_P]),
    "twell_dense_run": (_STATUS, [_P, _P, ctypes.POINTER(FfnTensors), _I64]),
    "twell_training_plan_create": (_STATUS, [_P, ctypes.POINTER(FfnSpec), _I64, _I64, ctypes.c_int, ctypes.POINTER(_P)]),
    "twell_training_plan_create_split": (_STATUS, [_P, ctypes.POINTER(FfnSpec), _I64, _I64, ctypes.c_int, _I64,
                                                   ctypes.POINTER(_P)]),
    "twell_training_plan_destroy": (_STATUS, [_P]),
    "twell_training_plan_describe": (_STATUS, [_P, ctypes.POINTER(ctypes.c_char_p)]),
    "twell_training_plan_recalibrate": (_STATUS, [_P]),
    "twell_training_state_create": (_STATUS, [_P, ctypes.POINTER(_P)]),
    "twell_training_state_destroy": (_STATUS, [_P]),
    "twell_training_forward": (_STATUS, [_P, _P, ctypes.POINTER(FfnTensors), _I64, _P, _P]),
    "twell_training_forward_keyed": (_STATUS, [_P, _P, ctypes.POINTER(FfnTensors), _I64, _P, _P, ctypes.c_uint64]),
    "twell_training_backward": (_STATUS, [_P, _P, ctypes.POINTER(FfnTensors), _P, _I64, _I64, _P,
                                          ctypes.POINTER(FfnGradients), ctypes.c_float, _I64, _P]),
}

_RUNTIME = "libtwell_runtime.so"
_JIT = "libtwell_jit.so"
_lock = threading.Lock()
_lib = None


def _candidate_dirs():
    """Where the libraries are looked for, in order."""
    env = os.environ.get("TWELL_LIB_DIR")
    if env:
        yield pathlib.Path(env), "$TWELL_LIB_DIR"
    here = pathlib.Path(__file__).resolve().parent
    yield here / "_lib", "the package (copied in by pip install after the CMake build)"
    # A source checkout used in place (PYTHONPATH=python, or pip install -e): the CMake build tree.
    yield here.parent.parent / "build" / "lib", "the source tree's build/lib"


def library_path() -> pathlib.Path:
    """The libtwell_runtime.so the package loads (raises ImportError naming the places searched)."""
    searched = []
    for d, what in _candidate_dirs():
        if (d / _RUNTIME).is_file():
            return d / _RUNTIME
        searched.append(f"{d} ({what})")
    raise ImportError(
        f"twell: {_RUNTIME} not found; searched: " + "; ".join(searched) +
        ". Build the project with CMake (README, 'Set up') and reinstall the package (pip install ./python), "
        "or set TWELL_LIB_DIR to the folder holding libtwell_runtime.so and libtwell_jit.so.")


def lib():
    """The loaded runtime (and, when found beside it, the JIT, which registers itself on load)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        # RTLD_LOCAL: libtwell_jit.so carries its own (static) LLVM and MLIR. Loaded globally, its
        # symbols would interpose on those of other LLVM users in the process (Triton, which
        # torch.compile imports, crashed so); locally, each keeps its own.
        runtime = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(runtime, name)
            fn.restype, fn.argtypes = restype, argtypes
        version = runtime.twell_c_api_version()
        if version != C_API_VERSION:
            raise ImportError(f"twell: {path} has C API version {version}; this package needs {C_API_VERSION}")
        jit = path.parent / _JIT
        if jit.is_file() and os.environ.get("TWELL_NO_JIT") != "1":
            ctypes.CDLL(str(jit), mode=ctypes.RTLD_LOCAL)
        _lib = runtime
        return _lib


def check(status: int) -> None:
    """Raises the exception of a failed status, with the library's message."""
    if status != 0:
        l = lib()
        message = (l.twell_last_error() or b"").decode(errors="replace")
        name = (l.twell_status_string(status) or b"?").decode()
        raise error_for_status(status, name, message)


def spec_struct(d_model: int, d_ff: int, *, gated: bool = True, activation: str = "relu", threshold: float = 0.0,
                dtype: str = "bf16", down_layout: str = "out_in", tile_n: int = 0, slots: int = 0,
                consumer: str | None = None) -> FfnSpec:
    s = FfnSpec()
    lib().twell_ffn_spec_init(ctypes.byref(s))
    s.d_model, s.d_ff, s.gated = d_model, d_ff, int(bool(gated))
    s.activation = choice(ACTIVATIONS, activation, "activation")
    s.threshold = threshold
    s.dtype = choice(DTYPES, dtype, "dtype")
    s.down_layout = choice(WEIGHT_LAYOUTS, down_layout, "down_layout")
    s.tile_n, s.slots = tile_n, slots
    s.consumer = choice(CONSUMERS, consumer, "consumer")
    return s


def choice(table: dict, value, name: str) -> int:
    """table[value], or InvalidArgumentError naming `name` and the accepted values."""
    if value not in table:
        raise InvalidArgumentError(f"twell: {name}: expected one of {', '.join(repr(k) for k in table)}, got {value!r}")
    return table[value]

