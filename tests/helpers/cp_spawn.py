"""Process-group plumbing shared by the CP test modules (tests/test_cp.py, test_cp_masks.py):
a free port, one spawned world per module, and the per-case reporting its workers share."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NCCL_WORLDS = (2, 4, 8)  # the GPU suites run at every size the machine's GPUs allow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(worker, world: int, out_path: str, deadline_s: float, what: str) -> dict:
    """Spawn `world` processes of worker(rank, world, port, out_path), wait at most deadline_s,
    and return the JSON rank 0 wrote to out_path; stragglers are terminated."""
    ctx = mp.spawn(worker, args=(world, free_port(), out_path), nprocs=world, join=False)
    deadline = time.time() + deadline_s
    try:
        while not ctx.join(timeout=5):
            if time.time() > deadline:
                raise TimeoutError(f"{world}-rank {what} did not finish in {deadline_s} s")
    except mp.ProcessExitedException as exc:
        done = "after" if os.path.exists(out_path) else "before"
        raise RuntimeError(f"{world}-rank {what}: a rank died {done} rank 0 wrote the results "
                           f"({exc})") from exc
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    with open(out_path) as f:
        return json.load(f)


def run_world_once(cache: dict, worker, world: int, tmpdir: str, deadline_s: float,
                   what: str) -> dict:
    """:func:`run_world` once per world size per test session (results kept in ``cache``): the
    many pytest cases of a suite read one spawned run."""
    if world not in cache:
        out_path = os.path.join(tmpdir, f"{what.replace(' ', '_')}_{world}.json")
        cache[world] = run_world(worker, world, out_path, deadline_s, what)
    return cache[world]


def report_cases(cases, world: int, rank: int, out_path: str, trace_limit: int = 6) -> None:
    """Run every (name, fn) case on this rank; fn returns None or a failure message, and an
    exception counts as its traceback. Every rank's messages are gathered per case, rank 0
    writes {"results": name -> message or None, "timings": name -> s} to out_path, and the
    rank exits (:func:`exit_without_teardown`)."""
    results, timings = {}, {}
    for name, fn in cases:
        t0 = time.time()
        try:
            msg = fn()
        except Exception:  # noqa: BLE001 - reported per case
            msg = traceback.format_exc(limit=trace_limit)
        msgs = [None] * world
        dist.all_gather_object(msgs, msg)
        results[name] = "\n".join(f"[rank {r}] {m}" for r, m in enumerate(msgs) if m) or None
        timings[name] = time.time() - t0
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"results": results, "timings": timings}, f)
    dist.barrier()
    exit_without_teardown()


def exit_without_teardown() -> None:
    """End a spawned rank whose work is done (the results are written and every rank passed
    the final barrier) at once, exit code 0, without tearing the process group down.

    About one spawned 2-rank gloo world in 150 on a loaded 2-core machine lost a rank to
    SIGABRT ("terminate called without an active exception": a C++ thread destroyed unjoined,
    which points at the process group's teardown). Nothing after the barrier is under test,
    so the rank skips destroy_process_group and the interpreter's teardown (os._exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def skip_unless_gpus(world: int) -> None:
    """Skip (with the reason) when this machine cannot host a `world`-rank NCCL / RCCL group."""
    have = torch.cuda.device_count()
    if have < world or not dist.is_nccl_available():
        pytest.skip(f"needs {world} GPUs and NCCL / RCCL (this machine has {have} GPUs)")


def assert_world_passes(worker, world: int, tmpdir: str, deadline_s: float, what: str) -> None:
    """Run a suite's worker over `world` NCCL ranks and fail listing every failed case."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts
    out_path = os.path.join(tmpdir, f"{what.replace(' ', '_')}_{world}.json")
    results = run_world(worker, world, out_path, deadline_s, what)["results"]
    bad = {name: msg for name, msg in results.items() if msg}
    assert not bad, f"{len(bad)} of {len(results)} cases failed at {world} ranks:\n" + "\n".join(
        f"{name}:\n{msg}" for name, msg in bad.items())
