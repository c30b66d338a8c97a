"""Contexts per CUDA device and FFN plans shared by every call of the same shape, dtype, device and
options (so the layers of a model share one plan's kernels and workspace).

A plan's workspace covers a token capacity: the first call of a shape makes a plan for the next power
of two of its token count (at least 64), a larger call replaces it with a larger one, up to
`max_tokens`; calls above that run in chunks of `max_tokens` rows. Plans are made and grown outside
CUDA-graph capture only (allocation and Dispatch "auto"'s calibration synchronize): a call that would
need either during capture raises, asking for a warm-up call first.
"""
from __future__ import annotations

import threading

import torch

from .. import runtime
from .._errors import InvalidArgumentError

_lock = threading.RLock()  # plan_for holds it while context() takes it again
_context_options: dict = {}
_contexts: dict[int, runtime.Context] = {}
_plans: dict[tuple, "PlanEntry"] = {}
MIN_CAPACITY = 64


def set_context_options(**options) -> None:
    """Options of the contexts twell.torch makes (twell.Context's keywords except device: cache_dir,
    disk_cache, target, bundles, jit). Applies to devices not used yet; call before the first op."""
    allowed = ("cache_dir", "disk_cache", "target", "bundles", "jit")
    for name in options:
        if name not in allowed:
            raise InvalidArgumentError(f"twell.torch.set_context_options: {name}: expected one of {', '.join(allowed)} "
                                       "(the device comes from the tensors)")
    runtime.Context(-1, **options)  # checks every value now, not at the first call on a GPU
    with _lock:
        _context_options.clear()
        _context_options.update(options)


def context(device: torch.device) -> runtime.Context:
    index = device.index if device.index is not None else torch.cuda.current_device()
    ctx = _contexts.get(index)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(index)
            if ctx is None:
                ctx = runtime.Context(index, **_context_options)
                if not ctx.has_gpu:
                    raise RuntimeError(f"twell.torch: device cuda:{index}: no GPU usable by twell ({ctx.no_gpu_reason})")
                _contexts[index] = ctx
    return ctx


def token_bucket(tokens: int, decode_max_tokens: int) -> tuple[int, bool]:
    """FfnPlan::run's token bucket: the power of two of `tokens`, and apart for calls the decode
    kernels take (the calls one Dispatch::Auto decision covers)."""
    return (tokens - 1).bit_length(), tokens <= decode_max_tokens


class PlanEntry:
    """A plan and the (decision key, token bucket) pairs it has run: Dispatch "auto" calibrates
    (synchronizing) on the first call of each, which must not happen during capture."""

    def __init__(self, plan: runtime.Plan, capacity: int):
        self.plan, self.capacity, self.seen = plan, capacity, set()

    def bucket(self, tokens: int, decision_key: int) -> tuple:
        return (decision_key,) + token_bucket(tokens, self.plan.options.decode_max_tokens)


def _capacity(tokens: int, limit: int) -> int:
    return min(limit, max(MIN_CAPACITY, 1 << max(0, tokens - 1).bit_length()))


def plan_for(device: torch.device, spec: runtime.FfnSpec, options: runtime.PlanOptions, max_tokens: int,
             tokens: int, capturing: bool) -> PlanEntry:
    """The shared plan of (device, spec, options, max_tokens) that holds min(tokens, max_tokens) rows."""
    key = (device.index, spec, options, max_tokens)
    need = min(tokens, max_tokens)
    entry = _plans.get(key)
    if entry is not None and entry.capacity >= need:
        return entry
    if capturing:
        raise RuntimeError(
            f"twell.torch: a call of {tokens} tokens (d_model {spec.d_model}, d_ff {spec.d_ff}) during CUDA-graph capture "
            f"needs a new plan workspace (largest so far: {entry.capacity if entry else 0} rows), which cannot be "
            "allocated while capturing: run the same call once before capture (warm-up)")
    with _lock:
        entry = _plans.get(key)
        if entry is None or entry.capacity < need:
            capacity = _capacity(need, max_tokens)
            entry = PlanEntry(context(device).plan(spec, capacity, options), capacity)
            _plans[key] = entry
    return entry


def clear() -> None:
    """Forgets every cached plan (their memory is freed once no call holds them)."""
    with _lock:
        _plans.clear()


def cached_plans() -> list[dict]:
    """What the cache holds: per plan its spec, options, capacity and kernel reports."""
    return [{"device": k[0], "spec": k[1], "options": k[2], "max_tokens": k[3], "capacity": e.capacity,
             "plan": e.plan.describe()} for k, e in list(_plans.items())]
