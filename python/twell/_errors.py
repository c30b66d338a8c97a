"""twell's exceptions: one per status code of the C API, each also a subclass of the built-in
exception a Python user would catch (an invalid argument is a ValueError, a missing file a
FileNotFoundError, ...)."""
from __future__ import annotations


class TwellError(Exception):
    """A failed twell call. `status` is the C API's status name (e.g. "TWELL_ERROR_CUDA")."""

    def __init__(self, message: str, status: str = "TWELL_ERROR_INTERNAL"):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(TwellError, ValueError):
    """An argument out of contract: shape, dtype, device, stride, alignment, option."""


class NotFoundError(TwellError, FileNotFoundError):
    """A file, a named tensor, or a kernel missing from the bundles without a JIT."""


class TwellIOError(TwellError, OSError):
    """A file that could not be read or written."""


class ParseError(TwellError, ValueError):
    """A damaged bundle, cache entry or file."""


class CompileError(TwellError, RuntimeError):
    """NVRTC or the generator rejected generated code."""


class CudaError(TwellError, RuntimeError):
    """A CUDA driver or cuBLASLt call failed."""


class NoDeviceError(TwellError, RuntimeError):
    """No CUDA driver or GPU."""


class UnsupportedError(TwellError, NotImplementedError):
    """Valid input this version does not implement."""


_BY_STATUS = {
    1: InvalidArgumentError,
    2: NotFoundError,
    3: TwellIOError,
    4: ParseError,
    5: CompileError,
    6: CudaError,
    7: NoDeviceError,
    8: UnsupportedError,
    9: MemoryError,
}


def error_for_status(status: int, name: str, message: str) -> Exception:
    cls = _BY_STATUS.get(status, TwellError)
    if cls is MemoryError:
        return MemoryError(f"twell: {message}")
    return cls(message, name)
