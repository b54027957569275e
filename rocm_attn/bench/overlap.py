"""How much of a call's communication runs hidden behind its compute, from a GPU kernel trace.

One call of ``fn`` is traced with torch.profiler. Communication kernels are those whose name
contains "nccl" (RCCL keeps the prefix); every other GPU kernel counts as compute. The exposed
communication time is the time during which a communication kernel runs and no compute kernel
does; hidden = 1 - exposed / communication time (both measured as unions of intervals, so
concurrent communication kernels are not counted twice).

Caveat: a communication kernel's duration includes the time it waits for its peer, so a rank
that reaches a step early sees that wait as communication; the benchmark therefore sums the
times over all ranks before taking the ratio.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Tuple

Interval = Tuple[float, float]


def union(intervals: Iterable[Interval]) -> List[Interval]:
    """Sorted, disjoint intervals covering exactly the input intervals."""
    out: List[List[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def exposed(comm: Iterable[Interval], compute: Iterable[Interval]) -> float:
    """Length of the time covered by `comm` but not by `compute`."""
    cover = union(compute)
    total, j = 0.0, 0
    for s, e in union(comm):
        while j < len(cover) and cover[j][1] <= s:  # compute intervals ending before s
            j += 1
        t, k = s, j
        while t < e:
            if k == len(cover) or cover[k][0] >= e:
                total += e - t
                break
            if cover[k][0] > t:
                total += cover[k][0] - t
            t = max(t, cover[k][1])
            k += 1
    return total


def traced_kernels(fn: Callable[[], object], align: Callable[[], object] = lambda: None
                   ) -> List[Tuple[str, float, float]]:
    """``(name, start ms, end ms)`` of the GPU kernels of one call of fn on this process's GPU.

    ``align`` (e.g. a barrier) runs inside the trace right before fn, so that every rank starts
    fn together; the GPU work it or anything earlier launched is left out (only kernels that
    start after fn was entered count). Profiler annotations are not kernels and are skipped.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        torch.cuda.synchronize()  # the first trace in a process pays the profiler's start-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        align()
        torch.cuda.synchronize()
        with record_function("rocm_attn.bench.traced_call"):
            fn()
            torch.cuda.synchronize()
    events = prof.events()
    start = min((e.time_range.start for e in events if e.name == "rocm_attn.bench.traced_call"),
                default=float("-inf"))
    return [(e.name, e.time_range.start / 1000.0, e.time_range.end / 1000.0)  # us -> ms
            for e in events
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.start >= start
            and not getattr(e, "is_user_annotation", False)]


def is_comm(name: str) -> bool:
    return "nccl" in name.lower()


def comm_times(kernels: List[Tuple[str, float, float]]) -> Tuple[float, float]:
    """(communication ms, exposed communication ms) of traced kernels (:func:`traced_kernels`)."""
    comm = [(s, e) for name, s, e in kernels if is_comm(name)]
    compute = [(s, e) for name, s, e in kernels if not is_comm(name)]
    return length(comm), exposed(comm, compute)


def kernel_summary(kernels: List[Tuple[str, float, float]], top: int) -> str:
    """Text table of traced kernels: span, GPU busy / idle time, then the ``top`` kernel names
    by total time (count, total ms)."""
    if not kernels:
        return "no kernels traced"
    span = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)
    busy = length((s, e) for _, s, e in kernels)
    compute = length((s, e) for n, s, e in kernels if not is_comm(n))
    totals: dict = {}
    for name, s, e in kernels:
        n, t = totals.get(name[:90], (0, 0.0))
        totals[name[:90]] = (n + 1, t + e - s)
    lines = [f"span {span:.3f} ms  busy {busy:.3f}  compute busy {compute:.3f}  "
             f"idle {span - busy:.3f}"]
    for name, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{t:9.3f} ms {n:4d}x  {name}")
    return "\n".join(lines)
