"""CUDA-event timing on the current stream: what dispatch "auto" and the benchmarks measure with."""
from __future__ import annotations

import torch


def cuda_event_times(fn, reps: int) -> list[float]:
    """Milliseconds of each of `reps` calls of fn() on the current stream (CUDA events; each call
    synchronized before the next starts)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times
