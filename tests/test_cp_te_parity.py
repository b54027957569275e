"""Transformer Engine parity of rocm_attn.attn_with_cp on CPU with gloo (one spawned group of 2
ranks for p2p / all_gather / a2a, one of 4 for a2a+p2p, whose a2a groups and ring both need two
ranks or more): TE's mask types (top-left "causal" between different q and kv lengths where the
comm type allows them), qkv_format bshd / sbhd with TE's sharding, return_max_logit against the
float64 oracle (every comm type, windows, chunks, padding between sequences), bitwise
reproducible backward passes under torch.use_deterministic_algorithms; and the seed
configuration over NCCL (2 GPUs)."""

from __future__ import annotations

import zlib
from datetime import timedelta
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest
import torch
import torch.distributed as dist

from rocm_attn import attn_with_cp, gather_from_cp, shard_for_cp
from rocm_attn.reference import reference_attention, reference_max_logit
from rocm_attn.varlen.max_logit import sharpened_error_bound

from helpers.cp import compare, cu_of, why_no_flash  # noqa: E402
from helpers.cp_spawn import assert_world_passes, report_cases, run_world_once, skip_unless_gpus

F64 = torch.float64
DEADLINE_S = 240


class Case(NamedTuple):
    name: str
    comm: str
    mask: str
    lens_q: List[int]
    lens_kv: Optional[List[int]] = None
    window: Tuple[int, int] = (-1, -1)
    chunk: Optional[int] = None
    fmt: str = "thd"
    pad: int = 0  # padding rows between sequences, in units of 2*cp (THD)
    h: Tuple[int, int] = (4, 2)
    d: int = 16
    dtype: torch.dtype = F64
    backend: str = "reference"
    deterministic: bool = False
    a2a: int = 0  # a2a+p2p: size of the a2a groups (consecutive ranks), the ring across them


MIXED, CROSS = [13, 3, 37, 6], [9, 17, 2, 30]


def cases(world: int = 2) -> List[Case]:
    out = []
    for comm in ("p2p", "all_gather", "a2a"):
        out += [
            Case(f"{comm}-causal-window-pad", comm, "causal", MIXED, window=(5, 0), pad=1),
            Case(f"{comm}-no_mask-chunk", comm, "no_mask", MIXED, chunk=4),
            Case(f"{comm}-padding_causal_br-chunk-window", comm, "padding_causal_bottom_right",
                 MIXED, window=(6, 0), chunk=8, pad=1),
            Case(f"{comm}-no_mask-window2", comm, "no_mask", MIXED, window=(3, 2)),
            Case(f"{comm}-causal-bshd", comm, "causal", [32, 32], fmt="bshd"),
            Case(f"{comm}-padding_causal-sbhd-lengths", comm, "padding_causal", [29, 17],
                 fmt="sbhd"),
            Case(f"{comm}-seed-like-bshd", comm, "causal", [64, 64], window=(8, 0), fmt="bshd",
                 h=(12, 2)),
            Case(f"{comm}-causal-deterministic", comm, "causal", MIXED, window=(5, 0),
                 deterministic=True, dtype=torch.float32),
        ]
    for comm in ("all_gather", "a2a"):  # different q and kv lengths: the alignments differ
        for mask in ("causal", "causal_bottom_right", "padding_causal"):
            out.append(Case(f"{comm}-{mask}-cross", comm, mask, MIXED, CROSS))
        out.append(Case(f"{comm}-causal-cross-window-chunk", comm, "causal", MIXED, CROSS,
                        window=(7, 0), chunk=6, pad=1))
        out.append(Case(f"{comm}-causal-cross-bshd", comm, "causal", [16, 16], [32, 32],
                        fmt="bshd"))
    # torch_flash on tests/helpers/flash_emulator.py: the sharpened-LSE max_logit pass per step
    for comm in ("p2p", "all_gather", "a2a"):
        out.append(Case(f"{comm}-emulated_flash-causal-window-pad", comm, "causal", MIXED,
                        window=(5, 0), pad=1, dtype=torch.float32, backend="emulated_flash"))
    out.append(Case("all_gather-emulated_flash-causal-cross-chunk", "all_gather", "causal", MIXED,
                    CROSS, chunk=6, dtype=torch.float32, backend="emulated_flash"))
    return [c._replace(name=f"cp{world}-{c.name}") for c in out]


def hier_cases(world: int = 4) -> List[Case]:
    """a2a+p2p at cp 4: a2a groups of 2 (ring of 2), of 4 (ring of 1) and of 1 (ring of 4).
    A ring type: a causal mask, a window or chunking need identical q and kv sequences (the
    two causal alignments then agree), so only the unmasked case crosses lengths."""
    c = "a2a+p2p"
    out = [
        Case("a2-causal-window-pad", c, "causal", MIXED, window=(5, 0), pad=1, a2a=2),
        Case("a2-causal_br-pad", c, "causal_bottom_right", MIXED, pad=1, a2a=2),
        Case("a2-padding_causal_br-chunk-window", c, "padding_causal_bottom_right", MIXED,
             window=(6, 0), chunk=8, pad=1, a2a=2),
        Case("a2-no_mask-window2-chunk", c, "no_mask", MIXED, window=(3, 2), chunk=6, a2a=2),
        Case("a2-no_mask-cross-pad", c, "no_mask", MIXED, CROSS, pad=1, a2a=2),
        Case("a2-causal-bshd", c, "causal", [32, 32], fmt="bshd", a2a=2),
        Case("a2-padding_causal-sbhd-lengths", c, "padding_causal", [29, 17], fmt="sbhd",
             window=(9, 0), a2a=2),
        Case("a2-seed-like-bshd", c, "causal", [64, 64], window=(8, 0), fmt="bshd", h=(12, 2),
             a2a=2),
        Case("a2-causal-deterministic", c, "causal", MIXED, window=(5, 0), pad=1,
             deterministic=True, dtype=torch.float32, a2a=2),
        Case("a4-causal-window-chunk-pad", c, "causal", MIXED, window=(7, 0), chunk=12, pad=1,
             h=(4, 4), a2a=4),
        Case("a1-padding-sbhd", c, "padding", [24, 11], fmt="sbhd", window=(4, 4), a2a=1),
    ]
    return [x._replace(name=f"cp{world}-{x.name}") for x in out]


def _round_up(n, m):
    return -(-n // m) * m


def _side(lens, cp, pad, fmt, s=None):
    """(cu, cu_padded, rows, valid): THD slots rounded up to 2cp plus ``pad`` * 2cp rows;
    bshd / sbhd: every row ``s`` (the longest rounded up) tokens."""
    if fmt != "thd":
        plens = [s] * len(lens)
    else:
        plens = [_round_up(n, 2 * cp) + pad * 2 * cp for n in lens]
    cu_p = cu_of(plens)
    valid = torch.zeros(int(cu_p[-1]), dtype=torch.bool)
    for i, n in enumerate(lens):
        valid[int(cu_p[i]): int(cu_p[i]) + n] = True
    return cu_of(lens), cu_p, int(cu_p[-1]), valid


def _poisoned(gen, rows, h, d, valid, dtype):
    x = torch.randn(rows, h, d, generator=gen, dtype=F64)
    return x.masked_fill(~valid.view(-1, 1, 1), float("nan")).to(dtype)


def _run(c: Case, group, cp: int, rank: int, device: str = "cpu",
         gather_group=None) -> Optional[str]:
    """One case on this rank: ``group`` the cp_group argument (a2a+p2p: this rank's pair),
    ``gather_group`` the group of all ``cp`` ranks (default ``group``)."""
    gg = group if gather_group is None else gather_group
    gen = torch.Generator().manual_seed(zlib.crc32(c.name.encode()))  # same on every rank
    lens_kv = c.lens_kv or c.lens_q
    s_q = _round_up(max(c.lens_q), 2 * cp)
    s_kv = _round_up(max(lens_kv), 2 * cp)
    cu_q, cu_qp, rows_q, vq = _side(c.lens_q, cp, c.pad, c.fmt, s_q)
    cu_kv, cu_kvp, rows_kv, vkv = _side(lens_kv, cp, c.pad, c.fmt, s_kv)
    h_q, h_kv = c.h
    q = _poisoned(gen, rows_q, h_q, c.d, vq, c.dtype)
    k = _poisoned(gen, rows_kv, h_kv, c.d, vkv, c.dtype)
    v = _poisoned(gen, rows_kv, h_kv, c.d, vkv, c.dtype)
    go = torch.randn(rows_q, h_q, c.d, generator=gen, dtype=F64)
    dev = torch.device(device)
    b = len(c.lens_q)

    def to_fmt(x, s):  # global THD rows [b*s] -> bshd / sbhd
        x = x.reshape(b, s, *x.shape[1:])
        return x if c.fmt == "bshd" else x.transpose(0, 1).contiguous()

    def shard(x, cu_p, s):
        if c.fmt == "thd":
            return shard_for_cp(x.to(dev), cu_p.to(dev), cp, rank)
        return shard_for_cp(to_fmt(x, s).to(dev), None, cp, rank, qkv_format=c.fmt)

    def gather(x, cu_p):
        if c.fmt == "thd":
            return gather_from_cp(x, cu_p.to(dev), cp, gg)
        y = gather_from_cp(x, None, cp, gg, qkv_format=c.fmt)
        y = y if c.fmt == "bshd" else y.transpose(0, 1)
        return y.reshape(-1, *y.shape[2:])

    runs = []
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(c.deterministic or prev)
    try:
        for _ in range(2 if c.deterministic else 1):
            q_l, k_l, v_l = (shard(x, cu_p, s).requires_grad_(True) for x, cu_p, s in
                             ((q, cu_qp, s_q), (k, cu_kvp, s_kv), (v, cu_kvp, s_kv)))
            if c.fmt == "thd":
                seq = dict(cu_seqlens_q_padded=cu_qp.to(dev), cu_seqlens_kv_padded=cu_kvp.to(dev))
                cus = (cu_q.to(dev), cu_kv.to(dev), max(c.lens_q), max(lens_kv))
            else:
                full = all(n == s_q for n in c.lens_q) and all(n == s_kv for n in lens_kv)
                seq = {}
                cus = (None, None, None, None) if full else (cu_q.to(dev), cu_kv.to(dev), None,
                                                              None)
            out, ml = attn_with_cp(q_l, k_l, v_l, *cus, group, cp_comm_type=c.comm,
                                   attn_mask_type=c.mask, window_size=c.window,
                                   chunk_size=c.chunk, qkv_format=c.fmt,
                                   backend="torch_flash" if c.backend == "emulated_flash"
                                   else c.backend,
                                   return_max_logit=True, **seq)
            go_l = shard(go, cu_qp, s_q)
            (out.to(F64) * go_l).nansum().backward()
            runs.append((out, ml, q_l.grad, k_l.grad, v_l.grad))
    finally:
        torch.use_deterministic_algorithms(prev)
    out, ml, dq, dk, dv = runs[0]
    errs = []
    if c.deterministic:
        for name, a, bb in zip(("out", "max_logit", "dq", "dk", "dv"), runs[0], runs[1]):
            if not torch.equal(torch.nan_to_num(a), torch.nan_to_num(bb)):
                errs.append(f"{name} differs between two identical calls")
    if ml.shape != (h_q,) or ml.dtype != torch.float32 or ml.requires_grad:
        errs.append(f"max_logit: shape {tuple(ml.shape)} dtype {ml.dtype}")
    mls = [torch.empty_like(ml) for _ in range(cp)]
    dist.all_gather(mls, ml.detach(), group=gg)
    if not all(torch.equal(m, ml) for m in mls):
        errs.append("max_logit differs between ranks")
    got = {"out": gather(out.detach(), cu_qp), "dq": gather(dq, cu_qp),
           "dk": gather(dk, cu_kvp), "dv": gather(dv, cu_kvp)}
    if rank != 0:
        return "; ".join(errs) or None
    qr, kr, vr = (x.to(F64).requires_grad_(True) for x in (q, k, v))
    pads = dict(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp)
    ro, _ = reference_attention(qr, kr, vr, cu_q, cu_kv, c.mask, c.window, c.chunk, **pads)
    (ro * go).nansum().backward()
    rml = reference_max_logit(qr.detach(), kr.detach(), cu_q, cu_kv, c.mask, c.window, c.chunk,
                              **pads)
    # bf16 / fp16 (GPU cases): input / output rounding and flash's 16-bit P (tests/test_cp.py)
    tol = {F64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}[c.dtype]
    want = {"out": ro, "dq": qr.grad, "dk": kr.grad, "dv": vr.grad}
    errs += [e for n in got for e in [compare(n, got[n].cpu(), want[n].detach(), tol)] if e]
    # flash steps (GPU) read the max from an LSE at softmax_scale * T: over-estimates by at most
    # ln(max_seqlen_kv) / T plus float32 rounding (rocm_attn.varlen.max_logit)
    flash = c.backend == "emulated_flash" or (c.backend == "auto" and dev.type == "cuda")
    sharp = sharpened_error_bound(max(lens_kv), rml.abs().max().item()) if flash else 0.0
    if not torch.allclose(ml.cpu().double(), rml, rtol=1e-5, atol=1e-5 + sharp):
        errs.append(f"max_logit {ml.tolist()} != oracle {rml.tolist()}")
    return "; ".join(errs) or None


def _hier_groups(world: int, rank: int) -> Dict[int, tuple]:
    """a2a size -> this rank's (a2a_group, p2p_group): a2a over consecutive ranks, the ring
    over the ranks with the same index in their a2a group, so CP rank = world rank (every rank
    creates every group in the same order, as torch.distributed requires)."""
    out = {}
    for a in (1, 2, 4):
        if world % a:
            continue
        a2a = [dist.new_group(list(range(s, s + a))) for s in range(0, world, a)]
        ring = [dist.new_group(list(range(i, world, a))) for i in range(a)]
        out[a] = (a2a[rank // a], ring[rank % a])
    return out


def _use_flash_emulator() -> None:
    """In a spawned CPU worker: torch_flash calls tests/helpers/flash_emulator.py (the
    "emulated_flash" cases; "reference" never reaches it)."""
    from helpers import flash_emulator

    from rocm_attn.varlen import backends

    backends._aten_flash = lambda: (flash_emulator.flash_forward, flash_emulator.flash_backward)
    backends._flash_problem = lambda q: None


def _worker(rank: int, world: int, port: int, out_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    w = dist.group.WORLD
    if world == 4:
        hier = _hier_groups(world, rank)
        todo = [(c.name, lambda c=c: _run(c, hier[c.a2a], world, rank, gather_group=w))
                for c in hier_cases(world)]
    else:
        _use_flash_emulator()
        todo = [(c.name, lambda c=c: _run(c, w, world, rank)) for c in cases(world)]
    report_cases(todo, world, rank, out_path)


_RESULTS: Dict[int, dict] = {}


@pytest.mark.parametrize("name", [c.name for c in cases(2)] + [c.name for c in hier_cases(4)])
def test_cp_te_parity(name, tmp_path_factory):
    world = int(name[2])
    res = run_world_once(_RESULTS, _worker, world, str(tmp_path_factory.getbasetemp()),
                         DEADLINE_S, "CP TE-parity group")
    assert name in res["results"], f"{name} did not run"
    assert res["results"][name] is None, f"{name} failed:\n{res['results'][name]}"


@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right", "padding_causal"])
def test_a2a_p2p_causal_needs_identical_sequences(mask):
    """a2a+p2p is a ring type: between different q and kv lengths, where top-left and
    bottom-right causal masks differ, it raises instead of picking an alignment."""
    from helpers.cp import FakeGroup

    cu_q, cu_kv = cu_of([8, 8]), cu_of([8, 16])
    q = torch.zeros(4, 2, 8, dtype=F64)
    kv = torch.zeros(6, 2, 8, dtype=F64)
    with pytest.raises(ValueError, match="cp_comm_type='a2a\\+p2p' with a causal mask needs "
                                         "identical q and kv sequences"):
        attn_with_cp(q, kv, kv, cu_q, cu_kv, 8, 16, (FakeGroup(2, 0), FakeGroup(2, 0)),
                     cp_comm_type="a2a+p2p", attn_mask_type=mask, return_max_logit=True)


# --------------------------------------------------------------------------
# GPU: NCCL, 2 GPUs (skipped with fewer)
# --------------------------------------------------------------------------


def gpu_cases() -> List[Case]:
    """The seed's configuration (b 2, s 4096, d 128, bf16, 12 heads / 2 kv heads, window
    (512, 0), cp 2) on every comm type through torch_flash, plus the CPU cases in bf16."""
    out = [Case(f"gpu-seed-{comm}", comm, "causal", [4096, 4096], window=(512, 0), fmt="bshd",
                h=(12, 2), d=128, dtype=torch.bfloat16, backend="auto")
           for comm in ("p2p", "all_gather", "a2a")]
    out += [Case(f"gpu-seed-{comm}-deterministic", comm, "causal", [4096, 4096],
                 window=(512, 0), fmt="bshd", h=(12, 2), d=128, dtype=torch.bfloat16,
                 backend="auto", deterministic=True) for comm in ("p2p", "all_gather", "a2a")]
    out += [c._replace(name="gpu-" + c.name, dtype=torch.bfloat16, backend="auto", d=64)
            for c in cases(2)]
    return out


def _nccl_worker(rank: int, world: int, port: int, out_path: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    report_cases([(c.name, lambda c=c: _run_gpu(c, rank)) for c in gpu_cases()], world, rank,
                 out_path)


def _run_gpu(c: Case, rank: int) -> Optional[str]:
    return _run(c, dist.group.WORLD, 2, rank, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
def test_gpu_nccl_te_parity(tmp_path):
    """The seed configuration and the CPU cases in bf16 through torch_flash over NCCL."""
    skip_unless_gpus(2)
    assert_world_passes(_nccl_worker, 2, str(tmp_path), DEADLINE_S, "CP TE-parity NCCL group")
