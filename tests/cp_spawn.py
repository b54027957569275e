"""Process-group plumbing shared by the CP test modules (tests/test_cp.py, test_cp_masks.py):
a free port, and one spawned world per module that runs every case and reports by JSON."""

from __future__ import annotations

import json
import socket
import time

import torch.multiprocessing as mp


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
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    with open(out_path) as f:
        return json.load(f)
