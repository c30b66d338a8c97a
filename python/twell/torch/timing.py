"""CUDA-event timing on the current stream: what dispatch "auto" and the benchmarks measure with."""
from __future__ import annotations

import time

import torch

_SPIN_CYCLES_PER_MS: dict[int, float] = {}


def _spin_cycles_per_ms(device: int) -> float:
    """Clock cycles of torch.cuda._sleep per millisecond on `device`, measured once per process."""
    rate = _SPIN_CYCLES_PER_MS.get(device)
    if rate is None:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # the spin kernel loaded before timing it
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
        rate = _SPIN_CYCLES_PER_MS[device] = cycles / max(start.elapsed_time(stop), 1e-3)
    return rate


def l2_eviction(device: torch.device):
    """A function that enqueues, on the current stream, a read of a scratch of twice the device's L2 (allocated
    here; freed with the function): after it the L2 holds other data, clean, so that the next call reads its
    weights from DRAM as a layer of a model does (the C++ calibration's l2_eviction.h; bench/README.md v71)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    scratch = torch.zeros(max(1, 2 * l2 // 4), dtype=torch.float32, device=device)
    return lambda: scratch.sum()


def cuda_event_times(fn, reps: int, before_each=None) -> list[float]:
    """Milliseconds of GPU time of each of `reps` calls of fn() on the current stream (CUDA events).

    The stream is held by a spin kernel (torch.cuda._sleep) while the calls are enqueued, so the events
    time the GPU's work back to back, not the host's Python and launch overhead between kernels: what a
    CUDA-graph replay sees (a decode-sized call is a few microseconds of GPU work behind about a hundred
    of host time). The C++ runtime's time_on_stream holds the stream the same way (a host function).
    before_each (e.g. l2_eviction(device)) is enqueued before every call, outside the events."""
    t0 = time.perf_counter()
    if before_each is not None:
        before_each()
    fn()  # untimed: its host time sizes the hold
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    hold_ms = min(2.0 * reps * host_ms + 0.1, 200.0)
    torch.cuda._sleep(int(hold_ms * _spin_cycles_per_ms(torch.cuda.current_device())))
    for start, stop in events:
        if before_each is not None:
            before_each()
        start.record()
        fn()
        stop.record()
    events[-1][1].synchronize()
    return [start.elapsed_time(stop) for start, stop in events]
