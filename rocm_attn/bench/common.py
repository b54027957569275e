"""Timing helpers shared by the benchmarks (tools/bench_*.py).

Two clocks:
  device  calls captured back to back in a CUDA/HIP graph and replayed: the GPU time of the
          work itself, no host dispatch between calls (how graph-captured pipelines run it,
          and what a % of the byte floor is about);
  eager   one call at a time between two events, the GPU idle before it: includes the
          host's dispatch cost, what an eager caller pays per call.
`time_ms` reports the device clock and falls back to eager (saying so) where capture fails.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch

GRAPH_CALLS = 20  # calls per captured graph: amortises the replay's own launch
# Untimed running of the timed work before its first timed call, in milliseconds (and at most
# SETTLE_MAX_RUNS runs). NOTE: after the host has kept the GPU idle (building the next row's
# inputs, freeing the last one's), memory-bound work ran up to 18% slower for its first 30-100
# ms on H100 and H200, with the SM clock at 1980 MHz and no throttle reason throughout; a few
# warm-up calls did not cover it, so a row's first timing read slower than the same work timed
# right after it (docs/performance.md#method).
SETTLE_MS = 100.0
SETTLE_MAX_RUNS = 2000


def _settle(run) -> None:
    """Runs `run` (one call or one graph replay) until SETTLE_MS have passed, then syncs; in
    batches of doubling size, so that short work is queued back to back, not one sync each."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    runs, batch = 0, 1
    while runs < SETTLE_MAX_RUNS:
        for _ in range(batch):
            run()
        runs += batch
        batch = min(2 * batch, 64)
        torch.cuda.synchronize()
        if (time.perf_counter() - t0) * 1e3 >= SETTLE_MS:
            break


def eager_ms(fn, reps: int = 30, warmup: int = 5, before_each=None, settle: bool = True) -> float:
    """Median of `reps` event-timed single calls of fn, after `warmup` untimed ones and (with
    `settle`) SETTLE_MS of untimed calls; `before_each` (untimed) runs ahead of every timed
    call, e.g. a barrier across ranks."""
    for _ in range(warmup):
        fn()
    if settle:
        _settle(fn)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before_each is not None:
            before_each()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_ms(fn, reps: int = 10, warmup: int = 3, calls: int = GRAPH_CALLS) -> float:
    """Per-call device time: median over `reps` replays of a graph of `calls` calls of fn, after
    SETTLE_MS of untimed replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as capture requires
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    _settle(graph.replay)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    # NOTE: each graph holds a private memory pool; released here, or a sweep of fwd+bwd
    # graphs on large inputs runs the device out of memory (seen on an H200: 130 GiB reserved)
    del graph
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return statistics.median(times)


_fallbacks: list[str] = []


def time_ms(fn, reps: int = 30, warmup: int = 5, name: str = "") -> float:
    """Device time per call (graph replay); eager time where fn cannot be captured.

    A `rotating` fn is captured over all its input sets at least once, so the graph cycles
    through as many bytes as the caller sized the rotation for.
    """
    try:
        calls = max(GRAPH_CALLS, getattr(fn, "num_sets", 1))
        return graph_ms(fn, reps=max(5, reps // 3), warmup=warmup, calls=calls)
    except Exception as exc:  # e.g. an anchor that syncs: timed eagerly, and reported
        why = type(exc).__name__
    # NOTE: outside the except block, so the failed capture's frames (its graph and memory
    # pool) are gone before the pool is released; a leaked pool per failed capture ran an H200
    # out of memory within a few cases.
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    msg = f"{name or getattr(fn, '__name__', 'fn')}: not capturable ({why}), timed eagerly"
    _fallbacks.append(msg)
    print(f"note: {msg}", file=sys.stderr)
    return eager_ms(fn, reps, warmup)


def eager_fallbacks() -> list[str]:
    """What time_ms had to time eagerly so far (for the JSON report)."""
    return list(_fallbacks)


def copy_bandwidth(rounds: int = 3) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), 2 GiB copy: the
    best of `rounds` medians of 20 copies, so that a slow moment cannot lower the floor.

    NOTE: single medians ranged 4147-4258 GB/s over one session's runs on an H200 (2.6%),
    moving every % of floor by as much; the best of three is the conservative floor."""
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = min(eager_ms(lambda: dst.copy_(src), reps=20) for _ in range(rounds))
    src = dst = None  # free the 4 GiB before the benchmark proper
    torch.cuda.empty_cache()
    return 2 * n / (ms * 1e-3)


# Square side of the matrix product that measures the matrix unit's throughput: large enough
# that cuBLAS runs at its best rate (the product's output, 128 MiB in bf16, is written once per
# 1.1 TFLOP).
MATMUL_SIDE = 8192


def matmul_throughput(dtype=torch.bfloat16, rounds: int = 3) -> float:
    """Dense matrix-product throughput in FLOP/s (one multiply-add = 2 FLOP): MATMUL_SIDE^3
    products in `dtype` (torch.matmul, cuBLAS), graph-replayed; the best of `rounds` medians, as
    copy_bandwidth, so that a slow moment cannot lower the ceiling.

    It is the matrix unit's rate that this device reaches on one large product: what bounds an
    attention call whose products, not its bytes, take the longer time (the matrix floor of the
    ranking rows)."""
    n = MATMUL_SIDE
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    ms = min(graph_ms(lambda: torch.matmul(a, b, out=c), reps=5, calls=10)
             for _ in range(rounds))
    a = b = c = None
    torch.cuda.empty_cache()
    return 2.0 * n**3 / (ms * 1e-3)


def rotating(fns):
    """Cycle through closures over different input sets (defeats L2 reuse between calls)."""
    state = {"i": 0}

    def call():
        fn = fns[state["i"] % len(fns)]
        state["i"] += 1
        return fn()

    call.num_sets = len(fns)
    return call


def with_tuning(setting: str, fn):
    """fn() with launch tuning values set (NAME=VALUE, several joined by "+"; NAME a
    rocm_attn.tuning name or its ROCM_ATTN_* variable), restored after it (--ab)."""
    import rocm_attn

    by_env = {env: knob for knob, env in rocm_attn.tuning.environment_names().items()}
    values = {}
    for part in setting.split("+"):
        name, value = part.split("=", 1)
        values[by_env.get(name, name)] = int(value)
    with rocm_attn.tuning.override(**values):
        return fn()
