"""The interval arithmetic behind bench_cp's "communication hidden" column."""

import random

from rocm_attn.bench.overlap import exposed, kernel_summary, length, union


def _exposed_by_sampling(comm, compute, step=0.25):
    """Oracle: count grid points (midpoints of `step` cells) in comm and not in compute."""
    end = max(e for _, e in comm + compute + [(0, 0)])
    n = 0
    for i in range(int(end / step) + 1):
        t = (i + 0.5) * step
        inside = lambda iv: any(s <= t < e for s, e in iv)  # noqa: E731
        n += inside(comm) and not inside(compute)
    return n * step


def test_union_merges_overlapping_and_touching_intervals():
    assert union([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert length([(0, 2), (1, 3), (10, 11)]) == 4


def test_exposed_examples():
    assert exposed([(0, 10)], []) == 10
    assert exposed([(0, 10)], [(0, 10)]) == 0
    assert exposed([(0, 10)], [(2, 3), (5, 7)]) == 7
    assert exposed([(0, 4), (2, 6)], [(-1, 1), (5, 9)]) == 4  # comm overlaps itself: counted once
    assert exposed([(3, 4)], [(0, 1), (8, 9)]) == 1


def test_exposed_matches_a_sampling_oracle_on_random_traces():
    rng = random.Random()
    for _ in range(200):
        def rand_ivs(n):
            out = []
            for _ in range(n):
                s = rng.randrange(0, 80) / 4
                out.append((s, s + rng.randrange(1, 24) / 4))
            return out
        comm, compute = rand_ivs(rng.randrange(1, 6)), rand_ivs(rng.randrange(0, 8))
        assert abs(exposed(comm, compute) - _exposed_by_sampling(comm, compute)) < 1e-9, (comm,
                                                                                         compute)


def test_kernel_summary_span_busy_idle_and_totals():
    kernels = [("flash_fwd", 0.0, 4.0), ("ncclDevKernel_SendRecv", 1.0, 6.5),
               ("merge", 7.0, 8.0), ("flash_fwd", 9.0, 10.0)]
    lines = kernel_summary(kernels, top=2).splitlines()
    # span 0..10; busy = union [0, 6.5] + [7, 8] + [9, 10] = 8.5; compute busy 4 + 1 + 1 = 6
    assert lines[0] == "span 10.000 ms  busy 8.500  compute busy 6.000  idle 1.500"
    assert len(lines) == 3  # the two largest totals only
    assert lines[1].split() == ["5.500", "ms", "1x", "ncclDevKernel_SendRecv"]
    assert lines[2].split() == ["5.000", "ms", "2x", "flash_fwd"]
    assert kernel_summary([], top=3) == "no kernels traced"
