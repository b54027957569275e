"""Tests of rocm_attn.attn_with_cp (context-parallel attention) on CPU with gloo.

Every configuration runs inside ONE spawned process group per world size (2 and 4 ranks; the
spawn is the slow part): the shards go through attn_with_cp forward and backward, outputs, LSE
and dq/dk/dv are gathered back (gather_from_cp) and compared with single-process
reference_attention on the full sequences. Inputs are random, padding and slack rows are NaN
(poison: they must never be read). Each configuration is its own pytest item, so a failure
names the configuration and carries the per-rank message. Argument errors are tested in-process
with a fake group object (no communication happens before the checks) and, for group
membership, inside the spawned group.
"""

from __future__ import annotations

import math
import os
import re
from datetime import timedelta
from typing import Dict, List, NamedTuple, Optional

import pytest
import torch
import torch.distributed as dist

import rocm_attn
from rocm_attn import attn_with_cp, gather_from_cp, shard_for_cp
from rocm_attn.reference import reference_attention

from helpers.cp import FakeGroup, compare, cu_of, rand_poisoned, why_no_flash  # noqa: E402
from helpers.cp_spawn import (NCCL_WORLDS, assert_world_passes, report_cases,  # noqa: E402  (tests/ is on sys.path)
                      run_world_once, skip_unless_gpus)

I32 = torch.int32
F64 = torch.float64
SPAWN_DEADLINE_S = 240

# --------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------


class Cfg(NamedTuple):
    name: str
    comm: str
    mask: str
    h_q: int
    h_kv: int
    lens_q: List[int]
    lens_kv: Optional[List[int]] = None  # None: same sequences as q (self-attention)
    layout: str = "padded"  # padded: pass *_padded | aligned: lengths % 2cp == 0, no *_padded
    slack: int = 0  # extra rows (in units of 2*cp) past cu_seqlens_padded[-1]
    dtype: torch.dtype = F64
    loss: str = "both"  # both | out (lse returned, unused) | nolse (return_lse=False) | lse
    group: str = "world"  # world | pairs (world 4 split into two cp=2 groups)
    d: int = 16
    seed: int = 0
    backend: str = "reference"  # or "emulated_flash": torch_flash on tests/helpers/flash_emulator.py
    save_ring_kv: bool = True  # ROCM_ATTN_CP_SAVE_RING_KV


MIXED = [13, 3, 37, 6]  # 3 (and 6 for cp=4) are shorter than 2*cp chunks before padding
SINGLE = [29]
WITH_EMPTY = [5, 0, 22]
CROSS_KV = [9, 17, 2, 30]


def _heads(comm: str, cp: int, kind: str):
    """(h_q, h_kv); a2a shards heads over the group, so its counts are multiples of cp (the
    same counts as the other comm types at cp 2, wider at 4 and 8)."""
    if kind == "mha":
        return (max(4, cp),) * 2 if comm == "a2a" else (4, 4)
    if kind == "mqa":
        return 4, 1
    return (2 * cp, cp) if comm == "a2a" and cp > 2 else (4, 2)


def configs(world: int) -> List[Cfg]:
    cp = world
    out: List[Cfg] = []
    seed = 0

    def add(name, comm, mask, heads="gqa", **kw):
        nonlocal seed
        seed += 1
        h_q, h_kv = _heads(comm, kw.pop("cp", cp), heads)
        out.append(Cfg(f"cp{world}-{name}", comm, mask, h_q, h_kv, seed=seed, **kw))

    for comm in ("p2p", "all_gather", "a2a"):
        for mask in ("no_mask", "causal"):
            for heads in ("gqa", "mha"):
                add(f"{comm}-{mask}-{heads}-mixed", comm, mask, heads, lens_q=MIXED)
        add(f"{comm}-causal-single", comm, "causal",
            "mqa" if comm != "a2a" else "gqa", lens_q=SINGLE)
        add(f"{comm}-no_mask-single", comm, "no_mask", lens_q=SINGLE)
        add(f"{comm}-causal-empty_seq", comm, "causal", lens_q=WITH_EMPTY)
        add(f"{comm}-no_mask-cross", comm, "no_mask", lens_q=MIXED, lens_kv=CROSS_KV)
        add(f"{comm}-causal-slack", comm, "causal", lens_q=MIXED, slack=1)
        al = [2 * cp * 3, 2 * cp, 2 * cp * 5]
        add(f"{comm}-causal-aligned_no_padded", comm, "causal", lens_q=al, layout="aligned")
        add(f"{comm}-no_mask-aligned_no_padded", comm, "no_mask", lens_q=al, layout="aligned")
    for comm in ("all_gather", "a2a"):  # bottom-right causal between different q / kv lengths
        add(f"{comm}-causal-cross", comm, "causal", lens_q=MIXED, lens_kv=CROSS_KV)
    add("p2p-padding_causal-alias", "p2p", "padding_causal", "mqa", lens_q=MIXED)
    add("all_gather-padding-alias", "all_gather", "padding", lens_q=MIXED)
    for comm, loss in (("p2p", "out"), ("all_gather", "nolse"), ("a2a", "out"),
                       ("p2p", "lse"), ("a2a", "lse"), ("all_gather", "lse"), ("a2a", "nolse")):
        add(f"{comm}-causal-loss_{loss}", comm, "causal", lens_q=MIXED, loss=loss)
    add("p2p-causal-bf16", "p2p", "causal", lens_q=MIXED, dtype=torch.bfloat16)
    # torch_flash's direct calls on the CPU emulator: seeded accumulators (fp16 ones at cp=2),
    # the reverse backward ring with and without the forward's saved kv
    for name, mask, kw in (("causal", "causal", {}), ("no_mask-slack", "no_mask", {"slack": 1}),
                           ("causal-no_saved_kv", "causal", {"save_ring_kv": False}),
                           ("causal-single", "causal", {"lens_q": SINGLE})):
        kw.setdefault("lens_q", MIXED)
        add(f"p2p-{name}-emulated_flash", "p2p", mask, dtype=torch.float16,
            backend="emulated_flash", **kw)
    add("all_gather-causal-fp32", "all_gather", "causal", lens_q=MIXED, dtype=torch.float32)
    add("a2a-no_mask-bf16", "a2a", "no_mask", "mha", lens_q=MIXED, dtype=torch.bfloat16)
    add("p2p-no_mask-fp16", "p2p", "no_mask", lens_q=WITH_EMPTY, dtype=torch.float16)
    if world == 4:  # two cp=2 groups in one world: group-local vs global ranks
        for comm in ("p2p", "all_gather", "a2a"):
            add(f"{comm}-causal-pairs", comm, "causal", cp=2, lens_q=MIXED, group="pairs")
    return out


# --------------------------------------------------------------------------
# problem construction and reference
# --------------------------------------------------------------------------


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class Side(NamedTuple):
    cu: torch.Tensor
    cu_padded: torch.Tensor
    valid: torch.Tensor  # bool [T]
    rows: int


def _side(lens, cp, layout, slack) -> Side:
    if layout == "aligned":
        assert all(n % (2 * cp) == 0 for n in lens)
        plens = list(lens)
    else:
        plens = [_round_up(n, 2 * cp) for n in lens]
    cu, cu_p = cu_of(lens), cu_of(plens)
    rows = int(cu_p[-1]) + slack * 2 * cp
    valid = torch.zeros(rows, dtype=torch.bool)
    for i, n in enumerate(lens):
        valid[int(cu_p[i]): int(cu_p[i]) + n] = True
    return Side(cu, cu_p, valid, rows)


def _problem(cfg: Cfg, cp: int):
    gen = torch.Generator().manual_seed(1000 + cfg.seed)
    sq = _side(cfg.lens_q, cp, cfg.layout, cfg.slack)
    skv = sq if cfg.lens_kv is None else _side(cfg.lens_kv, cp, cfg.layout, cfg.slack)
    q = rand_poisoned(gen, (sq.rows, cfg.h_q, cfg.d), sq.valid, cfg.dtype)
    k = rand_poisoned(gen, (skv.rows, cfg.h_kv, cfg.d), skv.valid, cfg.dtype)
    v = rand_poisoned(gen, (skv.rows, cfg.h_kv, cfg.d), skv.valid, cfg.dtype)
    go = torch.randn((sq.rows, cfg.h_q, cfg.d), generator=gen, dtype=F64)
    gl = torch.randn((cfg.h_q, sq.rows), generator=gen, dtype=F64)
    return sq, skv, q, k, v, go, gl


def _loss(cfg: Cfg, out, lse, go, gl):
    terms = []
    if cfg.loss != "lse":
        terms.append((out.to(F64) * go).sum())
    if cfg.loss in ("both", "lse"):
        lse64 = lse.to(F64)
        terms.append((torch.where(torch.isfinite(lse64), lse64, torch.zeros_like(lse64))
                      * gl).sum())
    return sum(terms)


def _tolerance(dtype, backend="reference"):
    # relative to max(1, max |reference|); low precision: rounding of inputs / outputs / grads
    # (observed with the reference backend: fp32 ~1.5e-7, fp16 ~3.5e-4, bf16 ~5e-3); flash
    # kernels also round P to 16 bits
    if backend != "reference" and dtype in (torch.bfloat16, torch.float16):
        return 3e-2 if dtype == torch.bfloat16 else 5e-3
    return {F64: 1e-10, torch.float32: 2e-6, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}[dtype]


def _run_config(cfg: Cfg, group, cp: int, rank: int, device: str = "cpu") -> Optional[str]:
    sq, skv, q, k, v, go, gl = _problem(cfg, cp)
    dev = torch.device(device)
    sq, skv = (Side(s.cu.to(dev), s.cu_padded.to(dev), s.valid, s.rows) for s in (sq, skv))
    q, k, v, go, gl = (x.to(dev) for x in (q, k, v, go, gl))
    padded = cfg.layout == "padded"
    cu_qp, cu_kvp = sq.cu_padded, skv.cu_padded
    shard = lambda x, cu, dim=0: shard_for_cp(x, cu, cp, rank, dim=dim)  # noqa: E731
    q_l = shard(q, cu_qp).requires_grad_(True)
    k_l = shard(k, cu_kvp).requires_grad_(True)
    v_l = shard(v, cu_kvp).requires_grad_(True)
    os.environ["ROCM_ATTN_CP_SAVE_RING_KV"] = "1" if cfg.save_ring_kv else "0"
    try:  # read by the forward only
        res = attn_with_cp(
            q_l, k_l, v_l, sq.cu, skv.cu, max(cfg.lens_q), max(cfg.lens_kv or cfg.lens_q),
            group, cp_comm_type=cfg.comm, attn_mask_type=cfg.mask,
            cu_seqlens_q_padded=cu_qp if padded else None,
            cu_seqlens_kv_padded=cu_kvp if padded else None,
            backend="torch_flash" if cfg.backend == "emulated_flash" else cfg.backend,
            return_lse=cfg.loss != "nolse")
    finally:
        del os.environ["ROCM_ATTN_CP_SAVE_RING_KV"]
    out, lse = res if cfg.loss != "nolse" else (res, None)
    if out.dtype != cfg.dtype or out.shape != q_l.shape:
        return f"out has dtype {out.dtype} / shape {tuple(out.shape)}"
    if lse is not None:
        want = F64 if cfg.dtype == F64 else torch.float32
        if lse.dtype != want or lse.shape != (cfg.h_q, q_l.shape[0]):
            return f"lse has dtype {lse.dtype} / shape {tuple(lse.shape)}"
    _loss(cfg, out, lse, shard(go, cu_qp), shard(gl, cu_qp, -1)).backward()
    got = {
        "out": gather_from_cp(out, cu_qp, cp, group),
        "dq": gather_from_cp(q_l.grad, cu_qp, cp, group),
        "dk": gather_from_cp(k_l.grad, cu_kvp, cp, group),
        "dv": gather_from_cp(v_l.grad, cu_kvp, cp, group),
    }
    if lse is None:
        lse = torch.zeros(cfg.h_q, q_l.shape[0], device=dev)  # keep the collectives in step
    got["lse"] = gather_from_cp(lse, cu_qp, cp, group, dim=-1)
    if rank != 0:
        return None
    # single-process reference on the full sequences, float64 from the same (rounded) inputs
    qr, kr, vr = (x.to(F64).requires_grad_(True) for x in (q, k, v))
    ro, rl = reference_attention(qr, kr, vr, sq.cu, skv.cu, cfg.mask, cu_seqlens_q_padded=cu_qp,
                                 cu_seqlens_kv_padded=cu_kvp)
    _loss(cfg, ro, rl, go, gl).backward()
    want = {"out": ro, "lse": rl}
    for n, x in (("dq", qr), ("dk", kr), ("dv", vr)):  # no grad: the loss does not reach x
        want[n] = torch.zeros_like(x) if x.grad is None else x.grad
    if cfg.loss == "nolse":
        del got["lse"]
    tol = _tolerance(cfg.dtype, cfg.backend)
    errs = [e for n in got for e in [compare(n, got[n], want[n].detach(), tol)] if e]
    return "; ".join(errs) or None


def _run_errors(world: int, rank: int, solo) -> Optional[str]:
    """Group-membership errors, checked inside the real process group."""
    if world != 2:
        return None
    errs = []
    cu = torch.tensor([0, 8], dtype=I32)
    x = torch.randn(4, 2, 8, dtype=F64)
    if rank != 0:  # not a member of dist.new_group([0])
        try:
            attn_with_cp(x, x, x, cu, cu, 8, 8, solo)
            errs.append("non-member rank: no error")
        except ValueError as e:
            if "not a member" not in str(e):
                errs.append(f"non-member rank: unexpected message {e}")
    try:
        gather_from_cp(x, cu, 4, dist.group.WORLD)
        errs.append("gather_from_cp with cp != group size: no error")
    except ValueError as e:
        if "cp=4" not in str(e):
            errs.append(f"gather_from_cp: unexpected message {e}")
    return "; ".join(errs) or None


# --------------------------------------------------------------------------
# spawned process group
# --------------------------------------------------------------------------


def _suite_cases(cfgs: List[Cfg], world: int, rank: int, device: str):
    """(name, fn) per configuration, on the world group or (group="pairs") on this rank's half
    of a 4-rank world split into two cp=2 groups."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else None

    def case(cfg):
        if cfg.group == "pairs":
            return lambda: _run_config(cfg, pairs[rank // 2], 2, rank % 2, device)
        return lambda: _run_config(cfg, dist.group.WORLD, world, rank, device)

    return [(cfg.name, case(cfg)) for cfg in cfgs]


def _use_flash_emulator() -> None:
    """In a spawned CPU worker: torch_flash calls tests/helpers/flash_emulator.py (backend
    "emulated_flash" configurations; "auto" and "reference" never reach it on CPU)."""
    from helpers import flash_emulator

    from rocm_attn.varlen import backends

    backends._aten_flash = lambda: (flash_emulator.flash_forward, flash_emulator.flash_backward)
    backends._flash_problem = lambda q: None


# --------------------------------------------------------------------------
# ranks that disagree (2 ranks): the same ValueError on every rank, no hang, no wrong result
# --------------------------------------------------------------------------


def _cons_args(rank: int, lens=(8, 4), **change):
    cu = cu_of(lens)
    t = sum(lens) // 2
    g = torch.Generator().manual_seed(100 + rank)
    q, k, v = (torch.randn(t, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    a = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8,
             cp_group=dist.group.WORLD)
    a.update(change)
    return a


def _expect_error(rank: int, per_rank: Dict[int, str], **args):
    """Call attn_with_cp; None when it raised a ValueError matching per_rank[rank]."""
    try:
        attn_with_cp(**args)
    except ValueError as e:
        if re.search(per_rank[rank], str(e)):
            return None
        return f"wrong message: {e}"
    return "no error (a wrong result would follow)"


def _consistency_cases(rank: int):
    """(name, fn) cases run by both ranks of the 2-rank world; on code without the cross-rank
    check they return wrong results or hang (the group timeout then fails the suite)."""
    both = lambda pat: {0: pat, 1: pat}  # noqa: E731
    return [
        ("cu_seqlens", lambda: _expect_error(
            rank, both(r"pass different cu_seqlens_q values \(ranks with equal values: \[0\]; "
                       r"\[1\]\)"),
            **_cons_args(rank, (8, 4) if rank == 0 else (4, 8)))),
        ("num_seqs", lambda: _expect_error(
            rank, both(r"disagree on b \(sequences\) \(rank 0: 2, rank 1: 3\)"),
            **_cons_args(rank, (8, 4) if rank == 0 else (4, 4, 4)))),
        ("comm_type", lambda: _expect_error(
            rank, both(r"disagree on cp_comm_type \(rank 0: 'p2p', rank 1: 'all_gather'\)"),
            **_cons_args(rank, cp_comm_type="p2p" if rank == 0 else "all_gather"))),
        ("window", lambda: _expect_error(
            rank, both(r"disagree on window_size\[0\] \(rank 0: 4, rank 1: -1\)"),
            **_cons_args(rank, window_size=(4, 0) if rank == 0 else (-1, -1)))),
        ("mask", lambda: _expect_error(
            rank, both(r"disagree on attn_mask_type \(rank 0: causal, rank 1: no_mask\)"),
            **_cons_args(rank, attn_mask_type="causal" if rank == 0 else "no_mask"))),
        ("one_rank_bad", lambda: _expect_error(
            rank, {0: r"rank\(s\) \[1\] of cp_group rejected their arguments",
                   1: r"chunk_size must be None or a positive int"},
            **_cons_args(rank, chunk_size=None if rank == 0 else 0))),
        ("global_tensors", lambda: _expect_error(
            rank, both(r"local q shard has 12 tokens, the unsharded global total "
                       r"cu_seqlens_q\[-1\] = 12"),
            **_cons_args(rank, q=torch.randn(12, 4, 8, dtype=F64),
                         k=torch.randn(12, 2, 8, dtype=F64),
                         v=torch.randn(12, 2, 8, dtype=F64)))),
        ("consistent_still_runs", lambda: None if torch.isfinite(
            attn_with_cp(**_cons_args(rank, validate="sync"))).all() else "non-finite output"),
    ]


def _worker(rank: int, world: int, port: int, out_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    solo = dist.new_group([0])
    _use_flash_emulator()
    cases = _suite_cases(configs(world), world, rank, "cpu")
    cases.append((f"cp{world}-errors", lambda: _run_errors(world, rank, solo)))
    if world == 2:
        cases += [(f"cp2-consistency-{name}", fn) for name, fn in _consistency_cases(rank)]
    report_cases(cases, world, rank, out_path)


_RESULTS: Dict[int, dict] = {}


def _spawn(world: int, tmpdir: str) -> dict:
    return run_world_once(_RESULTS, _worker, world, tmpdir, SPAWN_DEADLINE_S, "CP test group")


def _names(world: int) -> List[str]:
    extra = [f"cp2-consistency-{name}" for name, _ in _consistency_cases(0)] if world == 2 else []
    return [c.name for c in configs(world)] + [f"cp{world}-errors"] + extra


@pytest.mark.parametrize("name", _names(2) + _names(4))
def test_cp_matches_reference(name, tmp_path_factory):
    world = int(name[2])
    res = _spawn(world, str(tmp_path_factory.getbasetemp()))
    assert name in res["results"], f"{name} did not run"
    msg = res["results"][name]
    assert msg is None, f"{name} failed:\n{msg}"


# --------------------------------------------------------------------------
# single process: cp = 1 (no communication) and argument errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("comm", ["p2p", "all_gather", "a2a"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_cp1_equals_reference(comm, mask):
    cfg = Cfg("cp1", comm, mask, 4, 2, MIXED, seed=7)
    assert _run_config(cfg, FakeGroup(1), 1, 0) is None


def _good_args(cp=2):
    lens = [8, 4]  # multiples of 2*cp for cp in (1, 2)
    cu = cu_of(lens)
    t = sum(lens) // cp
    g = torch.Generator().manual_seed(0)
    q = torch.randn(t, 4, 8, generator=g, dtype=F64)
    k = torch.randn(t, 2, 8, generator=g, dtype=F64)
    v = torch.randn(t, 2, 8, generator=g, dtype=F64)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8,
                max_seqlen_kv=8, cp_group=FakeGroup(cp, 0))


def _with(**change):
    a = _good_args()
    a.update(change)
    return a


_ERR_CASES = [
    ("no_group", lambda: _with(cp_group=None), ValueError, "cp_group is required"),
    ("not_a_group", lambda: _with(cp_group=object()), ValueError, "ProcessGroup"),
    ("rank_outside_group", lambda: _with(cp_group=FakeGroup(2, 5)), ValueError, "not a member"),
    ("comm_unknown", lambda: _with(cp_comm_type="ring"), ValueError, "cp_comm_type must be"),
    ("a2a_p2p_group", lambda: _with(cp_comm_type="a2a+p2p"), ValueError,
     "cp_group=\\(a2a_group, p2p_group\\)"),
    ("a2a_p2p_heads", lambda: _with(cp_comm_type="a2a+p2p",
                                    cp_group=(FakeGroup(2, 0), FakeGroup(1, 0)),
                                    k=torch.randn(6, 1, 8, dtype=F64),
                                    v=torch.randn(6, 1, 8, dtype=F64)), ValueError,
     "multiples of its size \\(2\\)"),
    ("mask_unknown", lambda: _with(attn_mask_type="top_left"), ValueError, "attn_mask_type"),
    ("p2p_window_cross", lambda: _with(cu_seqlens_kv=cu_of([4, 8]), attn_mask_type="no_mask",
                                       window_size=(4, 0)), ValueError,
     "cp_comm_type='p2p' with window_size=\\(4, 0\\) needs identical q and kv"),
    ("p2p_chunk_cross", lambda: _with(cu_seqlens_kv=cu_of([4, 8]), attn_mask_type="no_mask",
                                      chunk_size=4), ValueError,
     "cp_comm_type='p2p' with chunk_size=4 needs identical q and kv"),
    ("chunk_bad", lambda: _with(chunk_size=0), ValueError, "chunk_size must be"),
    ("min_seqlen_bad", lambda: _with(min_seqlen=-1), ValueError, "min_seqlen must be"),
    ("min_seqlen_broken", lambda: _with(window_size=(2, 0), min_seqlen=6), ValueError,
     "min_seqlen=6 promises .* sequence 1 has 4 valid q tokens"),
    ("window_bad", lambda: _with(window_size=(1,)), ValueError, "window_size"),
    ("dtype_int", lambda: _with(q=torch.zeros(6, 4, 8, dtype=torch.int64)), ValueError,
     "float16, bfloat16"),
    ("dtype_mixed", lambda: _with(q=torch.randn(6, 4, 8)), ValueError, "share a dtype"),
    ("rank_2d", lambda: _with(q=torch.randn(6, 32, dtype=F64)), ValueError, "tokens, heads"),
    ("gqa_heads", lambda: _with(q=torch.randn(6, 3, 8, dtype=F64)), ValueError,
     "multiple of h_kv"),
    ("a2a_heads", lambda: _with(cp_comm_type="a2a", k=torch.randn(6, 1, 8, dtype=F64),
                                v=torch.randn(6, 1, 8, dtype=F64)), ValueError,
     "h_kv \\(1\\) must both be multiples of cp \\(2\\)"),
    ("cu_dtype", lambda: _with(cu_seqlens_q=torch.tensor([0, 8, 12])), ValueError, "int32"),
    ("cu_batch", lambda: _with(cu_seqlens_kv=cu_of([12])), ValueError, "b\\+1 = 3"),
    ("not_divisible_no_padded", lambda: _with(cu_seqlens_q=cu_of([6, 6]), cu_seqlens_kv=cu_of([6, 6])),
     ValueError, "sequence 0 has length 6, not a multiple of 2\\*cp = 4.*pad_for_cp"),
    ("padded_not_divisible", lambda: _with(cu_seqlens_q_padded=cu_of([6, 6]),
                                           cu_seqlens_kv_padded=cu_of([6, 6])),
     ValueError, "padded length of 6, not a multiple of 2\\*cp = 4"),
    ("valid_exceeds_slot", lambda: _with(cu_seqlens_q=cu_of([9, 3]), cu_seqlens_kv=cu_of([9, 3]),
                                         cu_seqlens_q_padded=cu_of([8, 4]),
                                         cu_seqlens_kv_padded=cu_of([8, 4]), max_seqlen_q=9,
                                         max_seqlen_kv=9), ValueError, "padded slot of 8"),
    ("shard_too_small", lambda: _with(q=torch.randn(4, 4, 8, dtype=F64)), ValueError,
     "local q shard has 4 tokens but cu_seqlens_q\\[-1\\] // cp = 12 // 2 = 6"),
    ("shard_odd", lambda: _with(q=torch.randn(7, 4, 8, dtype=F64)), ValueError, "odd count"),
    ("global_not_sharded_kv", lambda: _with(k=torch.randn(2, 2, 8, dtype=F64),
                                            v=torch.randn(2, 2, 8, dtype=F64)), ValueError,
     "local kv shard has 2 tokens"),
    ("max_seqlen", lambda: _with(max_seqlen_q=4), ValueError, "max_seqlen_q = 4"),
    ("max_seqlen_type", lambda: _with(max_seqlen_kv=8.0), ValueError, "max_seqlen_kv"),
    ("p2p_causal_cross", lambda: _with(cu_seqlens_kv=cu_of([4, 8])), ValueError,
     "cp_comm_type='p2p' with a causal mask needs identical q and kv"),
    ("backend_unknown", lambda: _with(backend="flash"), ValueError, "backend must be one of"),
    ("backend_flash_cpu", lambda: _with(backend="torch_flash"), ValueError,
     "torch_flash needs a CUDA or ROCm GPU"),
    ("cu_start", lambda: _with(cu_seqlens_q=torch.tensor([4, 12, 16], dtype=I32),
                               cu_seqlens_kv=torch.tensor([4, 12, 16], dtype=I32)), ValueError,
     "cu_seqlens_q\\[0\\] must be 0"),
]


@pytest.mark.parametrize("case", _ERR_CASES, ids=[c[0] for c in _ERR_CASES])
def test_argument_errors(case):
    _, make, exc, match = case
    with pytest.raises(exc, match=match):
        attn_with_cp(**make())


def test_good_args_pass_checks():
    # the error cases above start from arguments that are valid (cp=1 runs them end to end)
    a = _good_args(cp=1)
    out = attn_with_cp(**a)
    ref, _ = reference_attention(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_kv"])
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)


def test_unpadded_kv_side_alone_is_checked():
    # padded q layout given, kv layout defaults to cu_seqlens_kv which is not divisible
    a = _with(cu_seqlens_q=cu_of([7, 3]), cu_seqlens_kv=cu_of([7, 3]),
              cu_seqlens_q_padded=cu_of([8, 4]), cp_comm_type="all_gather",
              attn_mask_type="no_mask")
    with pytest.raises(ValueError, match="cu_seqlens_kv: sequence 0 has length 7"):
        attn_with_cp(**a)


def test_public_exports():
    assert rocm_attn.attn_with_cp is attn_with_cp
    assert rocm_attn.shard_for_cp is shard_for_cp
    assert rocm_attn.gather_from_cp is gather_from_cp


def test_shard_for_cp_is_thd_partition():
    cu_p = cu_of([8, 0, 16])
    x = torch.arange(24.0).reshape(24, 1)
    parts = [shard_for_cp(x, cu_p, 2, r) for r in range(2)]
    assert parts[0].flatten().tolist() == [0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23]
    assert parts[1].flatten().tolist() == [2, 3, 4, 5, 12, 13, 14, 15, 16, 17, 18, 19]


def test_auto_backend_on_cpu_is_reference(caplog):
    import logging

    from rocm_attn.varlen.backends import resolve_backend

    with caplog.at_level(logging.DEBUG, logger="rocm_attn.cp"):
        b = resolve_backend("auto", torch.randn(2, 2, 8, dtype=torch.bfloat16))
    assert b.name == "reference"
    assert "auto -> reference" in caplog.text


def test_lse_scale_and_math():
    # softmax_scale reaches the per-step backend; checked against the reference at cp=1
    a = _good_args(cp=1)
    out, lse = attn_with_cp(**a, softmax_scale=0.3, return_lse=True)
    ro, rl = reference_attention(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_kv"],
                                 softmax_scale=0.3)
    torch.testing.assert_close(out, ro, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, rl, atol=1e-12, rtol=1e-12)
    assert math.isfinite(float(lse.sum()))


# --------------------------------------------------------------------------
# GPU (marked gpu, skipped without one): the torch_flash backend and NCCL
# --------------------------------------------------------------------------


def _step_metas(plan):
    from rocm_attn.cp import steps

    metas = [steps.ring_step_meta(plan, s) for s in range(plan.cp)]
    return metas + steps.all_gather_step_metas(plan) + [steps.a2a_step_meta(plan)]


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
@pytest.mark.parametrize("cp,rank", [(1, 0), (2, 0), (2, 1), (4, 1), (4, 3)])
def test_gpu_torch_flash_steps_match_reference_backend(dtype, mask, cp, rank):
    """Every step kind (diagonal / below / above / full, all_gather halves, a2a) through the
    torch_flash backend equals the reference backend on the same step tensors, forward and
    backward (with an LSE cotangent and a 'final' LSE above the step's own)."""
    from rocm_attn.cp import api, layouts
    from rocm_attn.varlen.backends import ReferenceBackend, TorchFlashBackend

    dev = torch.device("cuda")
    d, h_q, h_kv = 64, 4, 2
    sq = _side(MIXED, cp, "padded", 0)
    cu, cu_p = sq.cu.to(dev), sq.cu_padded.to(dev)
    t = sq.rows // cp
    g = torch.Generator(device=dev).manual_seed(cp * 10 + rank)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device=dev).to(dtype)  # noqa: E731
    q, k, v = rnd(t, h_q, d), rnd(t, h_kv, d), rnd(t, h_kv, d)
    plan = api._make_plan(q, k, v, cu, cu, max(MIXED), max(MIXED), FakeGroup(cp, rank), "p2p",
                          mask, (-1, -1), None, cu_p, cu_p, None, "torch_flash", True, True)
    k_glob, v_glob = rnd(sq.rows, h_kv, d), rnd(sq.rows, h_kv, d)
    q_glob = rnd(sq.rows, h_q, d)
    ref, fl = ReferenceBackend(), TorchFlashBackend()
    cu_loc = plan.local_cu_q_padded
    for meta in _step_metas(plan):
        if meta.q_layout == "global":
            q_s, k_s, v_s = q_glob, k_glob, v_glob
        else:
            q_s = layouts.select_rows(q, meta.q_layout, cu_loc)
            if meta.kv_layout == "global":
                k_s, v_s = k_glob, v_glob
            else:
                k_s = layouts.select_rows(k, meta.kv_layout, cu_loc)
                v_s = layouts.select_rows(v, meta.kv_layout, cu_loc)
        o_r, l_r = ref.forward(q_s, k_s, v_s, meta, plan.softmax_scale)
        o_f, l_f = fl.forward(q_s, k_s, v_s, meta, plan.softmax_scale)
        tag = f"{meta.kind} (q {meta.q_layout}, kv {meta.kv_layout})"
        tol = _tolerance(dtype, "torch_flash")
        for name, a, b in (("out", o_f, o_r), ("lse", l_f, l_r)):
            err = compare(name, a, b, tol)
            assert err is None, f"{tag}: {err}"
        lse_fin = torch.where(l_r == float("-inf"), l_r, l_r + 0.3)
        out_fin = rnd(*o_r.shape)
        dout, dlse = rnd(*o_r.shape), torch.randn_like(l_r)
        for with_dlse in (False, True):
            dl = dlse if with_dlse else None
            gr = ref.backward(dout, q_s, k_s, v_s, out_fin, lse_fin, dl, meta, plan.softmax_scale)
            gf = fl.backward(dout, q_s, k_s, v_s, out_fin, lse_fin, dl, meta, plan.softmax_scale)
            for name, a, b in zip(("dq", "dk", "dv"), gf, gr):
                err = compare(name, a, b, tol)
                assert err is None, f"{tag}, dlse={with_dlse}: {err}"


def gpu_configs(world: int) -> List[Cfg]:
    """Every case of the CPU matrix at this world size in bf16 through backend='auto'
    (torch_flash), d=64; plus fp16 flash and float64 reference-backend cases over NCCL."""
    out = [c._replace(name="gpu-" + c.name, dtype=torch.bfloat16, backend="auto", d=64)
           for c in configs(world) if c.dtype == F64]
    for i, (comm, mask, dtype, backend) in enumerate([
            ("p2p", "no_mask", torch.float16, "auto"), ("p2p", "causal", F64, "reference"),
            ("all_gather", "no_mask", F64, "reference"), ("a2a", "no_mask", F64, "reference")]):
        h_q, h_kv = _heads(comm, world, "gqa")
        out.append(Cfg(f"gpu-cp{world}-{comm}-{mask}-{str(dtype)[6:]}-{backend}", comm, mask,
                       h_q, h_kv, MIXED, dtype=dtype, backend=backend, d=64, seed=100 + i))
    return out


def _nccl_worker(rank: int, world: int, port: int, out_path: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    report_cases(_suite_cases(gpu_configs(world), world, rank, "cuda"), world, rank, out_path)


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("world", NCCL_WORLDS)
def test_gpu_nccl_matches_reference(world, tmp_path):
    skip_unless_gpus(world)
    assert_world_passes(_nccl_worker, world, str(tmp_path), SPAWN_DEADLINE_S, "CP NCCL group")


def test_step_metadata_is_shared_between_calls_on_the_same_cu_seqlens():
    """Plans of calls on the same cu_seqlens share their step metadata (computed once, e.g. for
    all layers of a model). CPU tensors are keyed by value: equal values share, whatever the
    tensor; new values get fresh metadata, however they were written. GPU default (keyed by
    tensor identity and version, no sync): a tensor modified in place or a new tensor gets
    fresh metadata, an unmodified one shares."""
    from rocm_attn.cp import api

    cu = torch.tensor([0, 8, 24], dtype=torch.int32)
    q, k, v = (torch.randn(12, 2, 8) for _ in range(3))

    def plan(c):
        return api._make_plan(q, k, v, c, c, 16, 16, FakeGroup(2, 0), "p2p", "causal", (-1, -1),
                              None, None, None, None, "reference", False, None)

    a, b = plan(cu), plan(cu)
    assert a.meta_cache is b.meta_cache and a.meta_stale is None
    assert plan(cu.clone()).meta_cache is a.meta_cache
    cu.numpy()[1] = 12  # no version bump: still new values, so fresh metadata
    assert plan(cu).meta_cache is not a.meta_cache
    # by identity and version (the GPU default; forced here on CPU tensors)
    cu = torch.tensor([0, 8, 24], dtype=torch.int32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_STEP_CACHE", api.OrderedDict())
        cache = api._shared_step_cache((cu,) * 4, ("k",), by_value=False)[0]
        assert api._shared_step_cache((cu,) * 4, ("k",), by_value=False)[0] is cache
        assert api._shared_step_cache((cu.clone(),) * 4, ("k",), by_value=False)[0] is not cache
        cu[2] = 24  # in place (same values): the version moves on, so no reuse
        assert api._shared_step_cache((cu,) * 4, ("k",), by_value=False)[0] is not cache


def _stale_case(lens_a, lens_b):
    a = _good_args(cp=1)
    cu = cu_of(lens_a)
    a.update(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lens_a + lens_b),
             max_seqlen_kv=max(lens_a + lens_b))
    return a, cu


@pytest.mark.parametrize("write", ["numpy", "data"])
def test_plan_cache_follows_values_written_behind_the_version(write):
    """New cu_seqlens values written into the same tensor without a version bump (.numpy(),
    .data) give the result of the new layout, never one of the cached old layout (CPU: the
    cache is keyed by value)."""
    a, cu = _stale_case([8, 4], [4, 8])
    first = attn_with_cp(**a)
    new = torch.tensor([0, 4, 12], dtype=I32)
    if write == "numpy":
        cu.numpy()[:] = new.numpy()
    else:
        cu.data.copy_(new)
    got = attn_with_cp(**a)
    ref, _ = reference_attention(a["q"], a["k"], a["v"], new, new)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-12)
    assert not torch.equal(got, first)


def test_plan_cache_by_identity_poisons_a_stale_hit(monkeypatch):
    """Keyed by identity and version (the GPU default, forced here on CPU): values changed
    behind the version counter are caught on the device (no sync) and the output and LSE are
    NaN, never the old layout's result; a fresh tensor or an honest write computes normally."""
    from rocm_attn.cp import api

    monkeypatch.setattr(api, "_STEP_CACHE", api.OrderedDict())
    a, cu = _stale_case([8, 4], [4, 8])
    a["validate"] = False
    orig = api._shared_step_cache
    monkeypatch.setattr(api, "_shared_step_cache",
                        lambda t, p, by_value: orig(t, p, by_value=False))
    first, lse0 = attn_with_cp(**a, return_lse=True)
    assert torch.isfinite(first).all()
    cu.data.copy_(torch.tensor([0, 4, 12], dtype=I32))
    out, lse = attn_with_cp(**a, return_lse=True)
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    cu.copy_(torch.tensor([0, 4, 12], dtype=I32))  # bumps the version: fresh metadata
    out = attn_with_cp(**a)
    ref, _ = reference_attention(a["q"], a["k"], a["v"], cu, cu)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
