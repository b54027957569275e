"""Every python block of README.md and docs/*.md runs as written, each in a fresh interpreter
(from a scratch folder, with this checkout's rocm_attn). Blocks are discovered, so a new block
is covered the day it is written. A block's first line may say what it needs:

  # needs: gpu           a CUDA or ROCm GPU with the compiled kernels (a gpu-marked test)
  # needs: distributed   a process group, started here for it: 2 gloo ranks on the CPU
                         (with gpu too: nccl, one GPU per rank)

Every other block runs on a CPU-only machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import FrozenSet, List, NamedTuple

import pytest
import torch

from helpers.cp_spawn import free_port
from helpers.gpu import why_no_kernels

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:python|py)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NEEDS = re.compile(r"#\s*needs:\s*(.+?)\s*")
KNOWN_NEEDS = {"gpu", "distributed"}
WORLD = 2  # ranks of a distributed block
TIMEOUT_S = 300


class Block(NamedTuple):
    where: str  # file:line of the opening fence
    code: str
    needs: FrozenSet[str]


def blocks() -> List[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            code = m.group(1)
            first = code.lstrip("\n").split("\n", 1)[0]
            head = NEEDS.fullmatch(first)
            needs = frozenset(n.strip() for n in head.group(1).split(",")) if head else frozenset()
            if not head and re.match(r"#\s*needs\b", first):
                needs = frozenset([first])  # a malformed marker: reported as unknown
            line = text.count("\n", 0, m.start()) + 1
            found.append(Block(f"{path.relative_to(ROOT)}:{line}", code, needs))
    return found


BLOCKS = blocks()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _run(block: Block, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", block.code], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{block.where} failed:\n{proc.stdout}\n{proc.stderr}"


# Run in each rank: the process group the block takes as given, then the block as written.
# A rank whose block raised exits with its traceback; one whose block passed waits for the
# others and leaves as the CP test ranks do (cp_spawn.exit_without_teardown: no teardown of the
# group, which sometimes aborts a gloo rank on a loaded machine).
RANK_MAIN = f"""
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, {str(ROOT / "tests")!r})
from helpers.cp_spawn import exit_without_teardown
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gpu = os.environ["DOCS_BLOCK_GPU"] == "1"
if gpu:
    torch.cuda.set_device(rank)
dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
exec(compile(open(sys.argv[1]).read(), sys.argv[2], "exec"), {{"__name__": "__main__"}})
dist.barrier()
exit_without_teardown()
"""


# The port _free_port found may be taken by another process before rank 0 binds it; such a
# start is tried again on a fresh port (the block's own failures are not).
PORT_TAKEN = ("eaddrinuse", "address already in use")  # as the ranks' output reads, lowered


def _run_distributed(block: Block, cwd: Path, attempts: int = 3) -> None:
    for _ in range(attempts):
        failures = _start_ranks(block, cwd)
        port_taken = any(t in out.lower() for out in failures.values() for t in PORT_TAKEN)
        if not port_taken:
            break
    assert not failures, "\n".join(f"{block.where} failed on rank {rank}:\n{out}"
                                    for rank, out in failures.items())


def _start_ranks(block: Block, cwd: Path) -> dict:
    """{rank: output} of the ranks that failed in one start of the block's WORLD ranks."""
    source = cwd / "block.py"
    source.write_text(block.code)
    port = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = _env()
        env.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, DOCS_BLOCK_GPU="1" if "gpu" in block.needs else "0")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_MAIN, str(source),
                                       block.where], cwd=cwd, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return {rank: out for rank, (p, out) in enumerate(zip(procs, outputs)) if p.returncode != 0}


def _params(gpu: bool):
    return [pytest.param(b, id=b.where) for b in BLOCKS if ("gpu" in b.needs) == gpu]


def test_blocks_are_found_and_their_needs_known():
    assert len(BLOCKS) >= 6, [b.where for b in BLOCKS]
    for b in BLOCKS:
        assert b.needs <= KNOWN_NEEDS, f"{b.where}: unknown needs {sorted(b.needs - KNOWN_NEEDS)}"
    assert FENCE.findall("```python\nx = 1\n```\n") == ["x = 1\n"]


@pytest.mark.parametrize("block", _params(gpu=False))
def test_block_runs_on_cpu(block, tmp_path):
    if "distributed" in block.needs:
        _run_distributed(block, tmp_path)
    else:
        _run(block, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("block", _params(gpu=True))
def test_gpu_block_runs(block, tmp_path):
    why = why_no_kernels()
    if why:
        pytest.skip(why)
    if "distributed" in block.needs:
        if torch.cuda.device_count() < WORLD:
            pytest.skip(f"needs {WORLD} GPUs")
        _run_distributed(block, tmp_path)
    else:
        _run(block, tmp_path)
