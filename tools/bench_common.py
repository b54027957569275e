"""Timing helpers shared by the benchmarks (tools/bench_*.py)."""

from __future__ import annotations

import statistics

import torch


def time_ms(fn, reps: int = 30, warmup: int = 5) -> float:
    """Median of `reps` CUDA-event-timed calls of fn, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), 2 GiB copy."""
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), reps=20)
    src = dst = None  # free the 4 GiB before the benchmark proper
    torch.cuda.empty_cache()
    return 2 * n / (ms * 1e-3)


def rotating(fns):
    """Cycle through closures over different input sets (defeats L2 reuse between calls)."""
    state = {"i": 0}

    def call():
        fn = fns[state["i"] % len(fns)]
        state["i"] += 1
        return fn()

    return call
