"""twell: sparse feed-forward layers of sparsity-trained LLMs on NVIDIA GPUs (the TwELL format).

`twell.runtime` (Context, Plan, DenseFfn over device pointers) needs no PyTorch; `twell.torch` holds
the PyTorch operators and modules. The shared libraries (libtwell_runtime.so, libtwell_jit.so) are
loaded on first use (twell._capi.library_path says from where).
"""
from ._errors import (CompileError, CudaError, InvalidArgumentError, NoDeviceError, NotFoundError, ParseError,
                      TwellError, TwellIOError, UnsupportedError)
from .runtime import (Context, DenseFfn, FfnSpec, Plan, PlanOptions, choose_dense_neurons, choose_training_dense_neurons,
                      jit_available, tune, version)

__version__ = "0.1.0"

__all__ = ["Context", "Plan", "DenseFfn", "FfnSpec", "PlanOptions", "choose_dense_neurons", "choose_training_dense_neurons",
           "jit_available", "tune", "version",
           "TwellError", "InvalidArgumentError", "NotFoundError", "TwellIOError", "ParseError", "CompileError",
           "CudaError", "NoDeviceError", "UnsupportedError"]
