"""attn_with_cp with sliding windows, chunked attention and padding between sequences.

The matrix of the masks issue runs on CPU with gloo, at 2 and 4 ranks, inside ONE spawned
process group per world size (the spawn is the slow part): every comm type x {causal, full} x
window in {(-1,-1), (128,0), (512,512), (64,64) on short sequences} x chunk_size in {None, 256}
x pad_between_seqs in {False, True}, plus cross-attention, skipped ring steps (min_seqlen) and
low precision. Each configuration shards float64 inputs (padding rows poisoned with NaN), runs
forward and backward with the ``reference`` per-step backend through the whole CP machinery
(step metadata, communication, merges) and compares outputs, LSE and dq/dk/dv with
single-process ``reference_attention`` on the full sequences; outputs and gradients at padding
rows must be exactly zero, the LSE exactly ``-inf``. Shapes are tiny (d=8, 1-4 heads) so the
whole matrix stays within a few minutes on two cores.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest
import torch
import torch.distributed as dist

from rocm_attn import attn_with_cp, gather_from_cp, shard_for_cp
from rocm_attn.reference import reference_attention

from helpers.cp_spawn import (NCCL_WORLDS, assert_world_passes, report_cases,  # noqa: E402  (tests/ is on sys.path)
                      run_world_once, skip_unless_gpus)
from helpers.cp import FakeGroup, compare, cu_of, rand_poisoned, why_no_flash  # noqa: E402

I32 = torch.int32
F64 = torch.float64
SPAWN_DEADLINE_S = 420
COMMS = ("p2p", "all_gather", "a2a")

# window -> sequence lengths (before padding); long enough for the window to matter
WINDOWS = {
    (-1, -1): [300, 1100],
    (128, 0): [300, 1100],
    (512, 512): [300, 1100],
    (64, 64): [40, 96, 9, 0, 150, 23],  # short: one window spans several ranks' chunks
}


class Cfg(NamedTuple):
    name: str
    comm: str
    mask: str
    window: Tuple[int, int]
    chunk: Optional[int]
    pad: bool  # pad_between_seqs: cu_seqlens_*_padded differ from cu_seqlens_*
    lens_q: List[int]
    lens_kv: Optional[List[int]] = None  # None: self-attention
    h_q: int = 2
    h_kv: int = 1
    dtype: torch.dtype = F64
    min_seqlen: Optional[int] = None
    expect_steps: Optional[Dict[int, int]] = None  # p2p: rank -> ring steps computed
    a2a_size: int = 0  # a2a+p2p: size of the a2a groups (consecutive ranks)
    slack: int = 0  # extra rows (units of 2*cp) past cu_seqlens_padded[-1]
    return_lse: bool = True  # False: the loss sees the output only (no LSE cotangent)
    seed: int = 0


def _heads(comm: str, cp: int) -> Tuple[int, int]:
    return (cp, cp) if comm == "a2a" else (2, 1)  # a2a shards heads over the group


def _unpadded(lens: List[int], cp: int) -> List[int]:
    # without padding between sequences every length must be a multiple of 2*cp
    return [-(-n // (2 * cp)) * (2 * cp) for n in lens]


def configs(world: int) -> List[Cfg]:
    cp = world
    out: List[Cfg] = []

    def add(name, **kw):
        out.append(Cfg(f"cp{world}-{name}", seed=len(out) + 1, **kw))

    for comm in COMMS:
        h_q, h_kv = _heads(comm, cp)
        for mask in ("causal", "no_mask"):
            for window, lens in WINDOWS.items():
                for chunk in (None, 256):
                    for pad in (False, True):
                        w = "x".join(str(x) for x in window)
                        lq = lens if pad else _unpadded(lens, cp)
                        add(f"{comm}-{mask}-w{w}-c{chunk}-pad{int(pad)}", comm=comm, mask=mask,
                            window=window, chunk=chunk, pad=pad, lens_q=lq, h_q=h_q, h_kv=h_kv)
    # cross attention (bottom-right alignment between different q and kv lengths)
    for comm in ("all_gather", "a2a"):
        h_q, h_kv = _heads(comm, cp)
        for mask, window, chunk in (("causal", (40, 0), None), ("no_mask", (30, 20), 64),
                                    ("causal", (-1, -1), 64), ("no_mask", (-1, 25), None)):
            add(f"{comm}-cross-{mask}-w{window[0]}x{window[1]}-c{chunk}", comm=comm, mask=mask,
                window=window, chunk=chunk, pad=True, lens_q=[50, 130, 7, 0],
                lens_kv=[90, 70, 31, 12], h_q=h_q, h_kv=h_kv)
    # ring steps skipped under a min_seqlen promise: chunks of >= 50 tokens, reach < 50
    if cp == 4:
        steps = {0: 2, 1: 3, 2: 3, 3: 2}  # diagonal, s=1 (rank >= 1), s=cp-1 (rank <= cp-2)
        for mask, window, chunk in (("causal", (30, 0), None), ("no_mask", (20, 40), None),
                                    ("causal", (-1, -1), 40), ("no_mask", (10, 10), 32)):
            add(f"p2p-skip-{mask}-w{window[0]}x{window[1]}-c{chunk}", comm="p2p", mask=mask,
                window=window, chunk=chunk, pad=True, lens_q=[400, 0, 530], min_seqlen=400,
                expect_steps=steps)
        # at the edge: H = 50 and a reach of exactly H + 1 touches chunks two apart
        for mask, window in (("causal", (51, 0)), ("no_mask", (0, 51)), ("no_mask", (51, 3))):
            add(f"p2p-skip-edge-{mask}-w{window[0]}x{window[1]}", comm="p2p", mask=mask,
                window=window, chunk=None, pad=True, lens_q=[400], min_seqlen=400)
        add("p2p-skip-tiny_window_no_promise", comm="p2p", mask="causal", window=(0, 0),
            chunk=None, pad=True, lens_q=[41, 5], expect_steps={r: 1 for r in range(4)})
    # hierarchical: a2a inside groups of consecutive ranks, ring across them
    hier = [(2, "causal", (128, 0), None), (2, "no_mask", (512, 512), 256),
            (2, "causal", (-1, -1), 256), (2, "causal", (-1, -1), None),
            (2, "no_mask", (64, 64), None), (1, "causal", (128, 0), 256)]
    if cp == 4:
        hier += [(2, "no_mask", (-1, -1), None), (4, "causal", (64, 0), None)]
    for a, mask, window, chunk in hier:
        lens = WINDOWS[(64, 64)] if window == (64, 64) else WINDOWS[(128, 0)]
        add(f"a2a+p2p-a{a}-{mask}-w{window[0]}x{window[1]}-c{chunk}", comm="a2a+p2p",
            mask=mask, window=window, chunk=chunk, pad=True, lens_q=lens, h_q=4,
            h_kv=2 if a <= 2 else 4, a2a_size=a)
    # slack rows past the last sequence, and no LSE in the loss
    for comm, mask, window, chunk in (("p2p", "causal", (128, 0), None),
                                      ("all_gather", "no_mask", (64, 64), 256),
                                      ("a2a", "causal", (-1, -1), 256),
                                      ("p2p", "no_mask", (512, 512), None)):
        h_q, h_kv = _heads(comm, cp)
        lens = WINDOWS[window]
        add(f"{comm}-slack-{mask}-w{window[0]}x{window[1]}-c{chunk}", comm=comm, mask=mask,
            window=window, chunk=chunk, pad=True, lens_q=lens, h_q=h_q, h_kv=h_kv, slack=1)
        add(f"{comm}-nolse-{mask}-w{window[0]}x{window[1]}-c{chunk}", comm=comm, mask=mask,
            window=window, chunk=chunk, pad=True, lens_q=lens, h_q=h_q, h_kv=h_kv,
            return_lse=False)
    for comm in COMMS:  # low precision through the same machinery
        h_q, h_kv = _heads(comm, cp)
        add(f"{comm}-bf16-causal-w64x0-c128", comm=comm, mask="causal", window=(64, 0),
            chunk=128, pad=True, lens_q=[150, 300], h_q=h_q, h_kv=h_kv, dtype=torch.bfloat16)
    return out


# --------------------------------------------------------------------------
# problem construction
# --------------------------------------------------------------------------


class Side(NamedTuple):
    cu: torch.Tensor
    cu_padded: torch.Tensor
    valid: torch.Tensor  # bool [T]


def _side(lens: List[int], cp: int, pad: bool, slack: int = 0) -> Side:
    m = 2 * cp
    # padding between sequences: round up to 2*cp, and every other sequence one more 2*cp
    plens = [(-(-n // m) + (i % 2 if pad else 0)) * m for i, n in enumerate(lens)]
    cu, cu_p = cu_of(lens), cu_of(plens)
    valid = torch.zeros(int(cu_p[-1]) + slack * m, dtype=torch.bool)
    for i, n in enumerate(lens):
        valid[int(cu_p[i]): int(cu_p[i]) + n] = True
    return Side(cu, cu_p, valid)


def _tolerance(dtype) -> float:
    return {F64: 1e-10, torch.float32: 2e-6, torch.bfloat16: 1.5e-2}[dtype]


def _padding_exact(got: Dict[str, torch.Tensor], sq: Side, skv: Side) -> List[str]:
    errs = []
    for name, side in (("out", sq), ("dq", sq), ("dk", skv), ("dv", skv)):
        pad = got[name][~side.valid]
        if pad.numel() and not torch.equal(pad, torch.zeros_like(pad)):
            errs.append(f"{name}: padding rows are not exactly zero")
    lse_pad = got["lse"][:, ~sq.valid] if "lse" in got else torch.zeros(0)
    if lse_pad.numel() and not bool((lse_pad == float("-inf")).all()):
        errs.append("lse: padding rows are not -inf")
    return errs


def _steps_computed(cfg: Cfg, group, cp: int, rank: int) -> int:
    """Ring steps with at least one attention call on this rank (host metadata only)."""
    from rocm_attn.cp import api, steps

    sq = _side(cfg.lens_q, cp, cfg.pad)
    t = int(sq.cu_padded[-1]) // cp
    x = torch.zeros(t, cfg.h_q, 8, dtype=F64)
    plan = api._make_plan(x, x[:, : cfg.h_kv], x[:, : cfg.h_kv], sq.cu, sq.cu,
                          max(cfg.lens_q), max(cfg.lens_q), group, "p2p", cfg.mask, cfg.window,
                          cfg.chunk, sq.cu_padded, sq.cu_padded, None, "reference", True, None,
                          cfg.min_seqlen)
    return sum(1 for s in range(cp) if steps.ring_step_metas(plan, s))


def _run_config(cfg: Cfg, group, cp: int, rank: int, device: str = "cpu",
                backend: str = "reference", d: int = 8, gather_group=None) -> Optional[str]:
    """One configuration on this rank; ``group`` is the cp_group argument (a pair for
    a2a+p2p), ``gather_group`` the group of all ``cp`` ranks (default: ``group``)."""
    gather_group = group if gather_group is None else gather_group
    gen = torch.Generator().manual_seed(2000 + cfg.seed)
    sq = _side(cfg.lens_q, cp, cfg.pad, cfg.slack)
    skv = sq if cfg.lens_kv is None else _side(cfg.lens_kv, cp, cfg.pad, cfg.slack)
    q = rand_poisoned(gen, (len(sq.valid), cfg.h_q, d), sq.valid, cfg.dtype)
    k = rand_poisoned(gen, (len(skv.valid), cfg.h_kv, d), skv.valid, cfg.dtype)
    v = rand_poisoned(gen, (len(skv.valid), cfg.h_kv, d), skv.valid, cfg.dtype)
    go = torch.randn(q.shape, generator=gen, dtype=F64)
    gl = torch.randn((cfg.h_q, q.shape[0]), generator=gen, dtype=F64)
    dev = torch.device(device)
    cu_q, cu_kv, cu_qp, cu_kvp = (x.to(dev) for x in (sq.cu, skv.cu, sq.cu_padded,
                                                      skv.cu_padded))
    shard = lambda x, cu, dim=0: shard_for_cp(x.to(dev), cu, cp, rank, dim=dim)  # noqa: E731
    q_l = shard(q, cu_qp).requires_grad_(True)
    k_l = shard(k, cu_kvp).requires_grad_(True)
    v_l = shard(v, cu_kvp).requires_grad_(True)
    out = attn_with_cp(
        q_l, k_l, v_l, cu_q, cu_kv, max(cfg.lens_q), max(cfg.lens_kv or cfg.lens_q), group,
        cp_comm_type=cfg.comm, attn_mask_type=cfg.mask, window_size=cfg.window,
        chunk_size=cfg.chunk, cu_seqlens_q_padded=cu_qp if cfg.pad else None,
        cu_seqlens_kv_padded=cu_kvp if cfg.pad else None, backend=backend,
        return_lse=cfg.return_lse, min_seqlen=cfg.min_seqlen)
    out, lse = out if cfg.return_lse else (out, None)
    loss = (out.to(F64) * shard(go, cu_qp)).sum()
    if lse is not None:
        lse64 = lse.to(F64)
        loss = loss + (torch.where(torch.isfinite(lse64), lse64, torch.zeros_like(lse64))
                       * shard(gl, cu_qp, -1)).sum()
    else:  # the reference loss leaves the LSE out too; a placeholder keeps every rank's
        gl = torch.zeros_like(gl)  # gathers in step (it is not compared)
        lse = torch.full((cfg.h_q, q_l.shape[0]), float("-inf"), dtype=F64, device=dev)
    loss.backward()
    gg = gather_group
    got = {"out": gather_from_cp(out, cu_qp, cp, gg),
           "lse": gather_from_cp(lse, cu_qp, cp, gg, dim=-1),
           "dq": gather_from_cp(q_l.grad, cu_qp, cp, gg),
           "dk": gather_from_cp(k_l.grad, cu_kvp, cp, gg),
           "dv": gather_from_cp(v_l.grad, cu_kvp, cp, gg)}
    errs = []
    if cfg.expect_steps is not None:
        n = _steps_computed(cfg, group, cp, rank)
        if n != cfg.expect_steps[rank]:
            errs.append(f"rank {rank} computed {n} ring steps, expected {cfg.expect_steps[rank]}")
    if rank != 0:
        return "; ".join(errs) or None
    got = {n: x.cpu() for n, x in got.items()}
    qr, kr, vr = (x.to(F64).requires_grad_(True) for x in (q, k, v))
    ro, rl = reference_attention(qr, kr, vr, sq.cu, skv.cu, cfg.mask, cfg.window, cfg.chunk,
                                 cu_seqlens_q_padded=sq.cu_padded,
                                 cu_seqlens_kv_padded=skv.cu_padded)
    ((ro * go).sum() + (torch.where(torch.isfinite(rl), rl, torch.zeros_like(rl)) * gl).sum()
     ).backward()
    want = {"out": ro, "lse": rl}
    for n, x in (("dq", qr), ("dk", kr), ("dv", vr)):
        want[n] = torch.zeros_like(x) if x.grad is None else x.grad
    if not cfg.return_lse:
        del got["lse"], want["lse"]
    tol = _tolerance(cfg.dtype) if backend == "reference" else 3e-2
    errs += [e for n in got for e in [compare(n, got[n], want[n].detach(), tol)] if e]
    errs += _padding_exact(got, sq, skv)
    return "; ".join(errs) or None


# --------------------------------------------------------------------------
# spawned process group (gloo)
# --------------------------------------------------------------------------


def _hier_groups(world: int, rank: int) -> Dict[int, tuple]:
    """a2a size -> (a2a_group, p2p_group) of this rank: a2a over consecutive ranks, the ring
    over ranks with the same index in their a2a group (every rank creates every group, in the
    same order, as torch.distributed requires)."""
    out = {}
    for a in (1, 2, 4):
        if world % a:
            continue
        a2a = [dist.new_group(list(range(s, s + a))) for s in range(0, world, a)]
        ring = [dist.new_group(list(range(i, world, a))) for i in range(a)]
        out[a] = (a2a[rank // a], ring[rank % a])
    return out


def _suite_cases(cfgs: List[Cfg], world: int, rank: int, device: str, backend: str = "reference",
                 d: int = 8):
    """(name, fn) per configuration; a2a+p2p cases get this rank's (a2a, ring) group pair."""
    hier = _hier_groups(world, rank)

    def case(cfg):
        group = hier[cfg.a2a_size] if cfg.comm == "a2a+p2p" else dist.group.WORLD
        return lambda: _run_config(cfg, group, world, rank, device=device, backend=backend, d=d,
                                   gather_group=dist.group.WORLD)

    return [(cfg.name, case(cfg)) for cfg in cfgs]


def _worker(rank: int, world: int, port: int, out_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    report_cases(_suite_cases(configs(world), world, rank, "cpu"), world, rank, out_path,
                 trace_limit=8)


_RESULTS: Dict[int, dict] = {}


def _spawn(world: int, tmpdir: str) -> dict:
    return run_world_once(_RESULTS, _worker, world, tmpdir, SPAWN_DEADLINE_S, "CP mask test group")


@pytest.mark.parametrize("name", [c.name for w in (2, 4) for c in configs(w)])
def test_cp_masks_match_reference(name, tmp_path_factory):
    world = int(name[2])
    res = _spawn(world, str(tmp_path_factory.getbasetemp()))
    assert name in res["results"], f"{name} did not run"
    msg = res["results"][name]
    assert msg is None, f"{name} failed:\n{msg}"


# --------------------------------------------------------------------------
# GPU (marked gpu, skipped without one): torch_flash per step, and the matrix on 2 GPUs
# --------------------------------------------------------------------------


GPU_STEP_SPECS = [("causal", (128, 0), None), ("causal", (-1, -1), 256), ("causal", (64, 0), 96),
                  ("no_mask", (512, 512), None), ("no_mask", (64, 64), 256),
                  ("no_mask", (0, -1), None), ("no_mask", (-1, 30), 100)]


def _check_flash_steps(mask, window, chunk, cp, rank, device, dtype, tol, d=64,
                       lens=(300, 1100, 9, 0, 150)):
    """Every call of every comm type (ring steps, all_gather, a2a) through TorchFlashBackend
    equals ReferenceBackend on the same step tensors, forward and backward (with and without
    an LSE cotangent, against a 'final' LSE above the step's own)."""
    from rocm_attn.cp import api, layouts, steps
    from rocm_attn.varlen.backends import ReferenceBackend, TorchFlashBackend

    dev = torch.device(device)
    h_q, h_kv = 4, 2
    lens = list(lens)
    sq = _side(lens, cp, True)
    cu, cu_p = sq.cu.to(dev), sq.cu_padded.to(dev)
    t = len(sq.valid) // cp
    g = torch.Generator(device=dev).manual_seed(cp * 10 + rank)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device=dev).to(dtype)  # noqa: E731
    q, k, v = rnd(t, h_q, d), rnd(t, h_kv, d), rnd(t, h_kv, d)
    plan = api._make_plan(q, k, v, cu, cu, max(lens), max(lens), FakeGroup(cp, rank), "p2p",
                          mask, window, chunk, cu_p, cu_p, None, "reference", True, False)
    q_glob, k_glob, v_glob = rnd(len(sq.valid), h_q, d), rnd(len(sq.valid), h_kv, d), rnd(
        len(sq.valid), h_kv, d)
    metas = [m for s in range(cp) for m in steps.ring_step_metas(plan, s)]
    metas += steps.all_gather_step_metas(plan) + [steps.a2a_step_meta(plan)]
    ref, fl = ReferenceBackend(), TorchFlashBackend()
    cu_loc = plan.local_cu_q_padded
    for meta in metas:
        q_s = q_glob if meta.q_layout == "global" else layouts.select_rows(q, meta.q_layout,
                                                                           cu_loc)
        if meta.kv_layout == "global":
            k_s, v_s = k_glob, v_glob
        else:
            k_s = layouts.select_rows(k, meta.kv_layout, cu_loc)
            v_s = layouts.select_rows(v, meta.kv_layout, cu_loc)
        o_r, l_r = ref.forward(q_s, k_s, v_s, meta, plan.softmax_scale)
        o_f, l_f = fl.forward(q_s, k_s, v_s, meta, plan.softmax_scale)
        tag = f"{meta.kind} (q {meta.q_layout}, kv {meta.kv_layout}, window {meta.window_size})"
        for name, a, b in (("out", o_f, o_r), ("lse", l_f, l_r)):
            err = compare(name, a.cpu(), b.cpu(), tol)
            assert err is None, f"{tag}: {err}"
        lse_fin = torch.where(l_r == float("-inf"), l_r, l_r + 0.3)
        out_fin, dout, dlse = rnd(*o_r.shape), rnd(*o_r.shape), torch.randn_like(l_r)
        for dl in (None, dlse):
            gr = ref.backward(dout, q_s, k_s, v_s, out_fin, lse_fin, dl, meta, plan.softmax_scale)
            gf = fl.backward(dout, q_s, k_s, v_s, out_fin, lse_fin, dl, meta, plan.softmax_scale)
            for name, a, b in zip(("dq", "dk", "dv"), gf, gr):
                err = compare(name, a.cpu(), b.cpu(), tol)
                assert err is None, f"{tag}, dlse={dl is not None}: {err}"


STEP_CASES = [(m, w, c, cp, r) for m, w, c in GPU_STEP_SPECS
              for cp, r in [(1, 0), (2, 0), (2, 1), (4, 1), (4, 3)]]


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("mask,window,chunk,cp,rank", STEP_CASES)
def test_gpu_torch_flash_mask_steps_match_reference_backend(mask, window, chunk, cp, rank):
    """torch_flash (bf16) on every windowed / chunked call: where the flash window conventions
    (bottom-right alignment, -1 handling, rows without keys) meet the piece metadata."""
    _check_flash_steps(mask, window, chunk, cp, rank, "cuda", torch.bfloat16, 3e-2)


# the GPU specs scaled down 4x (windows, chunks and lengths), one (cp, rank) per spec, plus
# the core (unwindowed) steps
EMULATOR_CASES = [("causal", (32, 0), None, 2, 1), ("causal", (-1, -1), 64, 4, 1),
                  ("causal", (16, 0), 24, 4, 3), ("no_mask", (128, 128), None, 1, 0),
                  ("no_mask", (16, 16), 64, 2, 1), ("no_mask", (0, -1), None, 4, 1),
                  ("no_mask", (-1, 8), 25, 4, 3), ("causal", (-1, -1), None, 4, 2),
                  ("no_mask", (-1, -1), None, 2, 1)]


@pytest.mark.parametrize("mask,window,chunk,cp,rank", EMULATOR_CASES)
def test_flash_backend_on_cpu_emulator(mask, window, chunk, cp, rank, monkeypatch):
    """The same checks on CPU with tests/helpers/flash_emulator.py standing in for the aten ops (the
    wrapper's window conversions, +inf LSE of empty rows, uninitialised rows as NaN), in
    float64: the backend's packing, max_seqlen adjustments and LSE-cotangent trick."""
    from helpers import flash_emulator

    from rocm_attn.varlen import backends

    monkeypatch.setattr(backends, "_aten_flash",
                        lambda: (flash_emulator.flash_forward, flash_emulator.flash_backward))
    _check_flash_steps(mask, window, chunk, cp, rank, "cpu", F64, 1e-5, d=8,
                       lens=(75, 275, 9, 0, 38))


def _check_direct_ring_steps(mask, window, chunk, cp, rank, device, dtype, tol, d=64,
                             lens=(300, 1100, 9, 0, 150)):
    """Every p2p ring step through TorchFlashBackend's direct calls (whole tensors, dummy
    sub-sequences, merges and gradient adds by row index) equals the same step through
    ReferenceBackend's calls, accumulated as ring_forward / ring_backward do."""
    import dataclasses

    from rocm_attn.cp import api, p2p, steps
    from rocm_attn.varlen.backends import TorchFlashBackend

    dev = torch.device(device)
    h_q, h_kv = 4, 2
    sq = _side(list(lens), cp, True)
    cu, cu_p = sq.cu.to(dev), sq.cu_padded.to(dev)
    t = len(sq.valid) // cp
    g = torch.Generator(device=dev).manual_seed(cp * 10 + rank + 1)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device=dev).to(dtype)  # noqa: E731
    q, kv = rnd(t, h_q, d), rnd(2, t, h_kv, d)
    ref_plan = api._make_plan(q, kv[0], kv[1], cu, cu, max(lens), max(lens), FakeGroup(cp, rank),
                              "p2p", mask, window, chunk, cu_p, cu_p, None, "reference", True,
                              False)
    dir_plan = dataclasses.replace(ref_plan, backend=TorchFlashBackend(), meta_cache={})
    cdt = torch.float64 if dtype == F64 else torch.float32
    for step in range(cp):
        metas = steps.ring_step_metas(dir_plan, step)
        assert all(m.direct is not None for m in metas)
        res = {}
        for name, plan in (("ref", ref_plan), ("dir", dir_plan)):
            rows = t + (1 if p2p._dummy_row(plan) else 0)
            out = torch.zeros(rows, h_q, d, dtype=cdt, device=dev)
            lse = torch.full((h_q, rows), float("-inf"), dtype=cdt, device=dev)
            p2p.forward_step(out, lse, plan, q, kv, step, True)
            res[name] = [out[:t], lse[:, :t]]
        tag = f"step {step} ({[m.kind for m in metas]})"
        for i, what in enumerate(("out", "lse")):
            err = compare(what, res["dir"][i].cpu(), res["ref"][i].cpu(), tol)
            assert err is None, f"{tag}: {err}"
        l_ref = res["ref"][1]
        lse_fin = torch.where(l_ref == float("-inf"), l_ref, l_ref + 0.3).contiguous()
        out_fin, dout = rnd(t, h_q, d), rnd(t, h_q, d)
        dlse = torch.randn(h_q, t, generator=g, device=dev, dtype=cdt)
        for dl in (None, dlse):
            grads = {}
            for name, plan in (("ref", ref_plan), ("dir", dir_plan)):
                extra = 1 if p2p._dummy_row(plan) else 0
                dq = torch.zeros(t + extra, h_q, d, dtype=cdt, device=dev)
                dkv = torch.zeros(2, t + extra, h_kv, d, dtype=cdt, device=dev)
                parts = p2p.backward_step(dq, plan, dout, dl, q, kv, out_fin, lse_fin, step)
                p2p.fold_kv_grads(dkv, parts, plan)
                grads[name] = (dq[:t], dkv[0, :t], dkv[1, :t])
            for what, a, b in zip(("dq", "dk", "dv"), grads["dir"], grads["ref"]):
                err = compare(what, a.cpu(), b.cpu(), tol)
                assert err is None, f"{tag}, dlse={dl is not None}: {err}"


@pytest.mark.parametrize("mask,window,chunk,cp,rank", EMULATOR_CASES)
def test_direct_ring_steps_on_cpu_emulator(mask, window, chunk, cp, rank, monkeypatch):
    """Direct flash calls (no packing copies) on CPU with the emulator, float64: the dummy
    sub-sequences, the grouping that keeps q and kv ranges increasing, merges and adds by
    row index, padding between sequences."""
    from helpers import flash_emulator

    from rocm_attn.varlen import backends

    monkeypatch.setattr(backends, "_aten_flash",
                        lambda: (flash_emulator.flash_forward, flash_emulator.flash_backward))
    _check_direct_ring_steps(mask, window, chunk, cp, rank, "cpu", F64, 1e-5, d=8,
                             lens=(75, 275, 9, 0, 38))


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("mask,window,chunk,cp,rank", STEP_CASES)
def test_gpu_direct_ring_steps_match_reference(mask, window, chunk, cp, rank):
    _check_direct_ring_steps(mask, window, chunk, cp, rank, "cuda", torch.bfloat16, 3e-2)


def gpu_configs(world: int) -> List[Cfg]:
    """The CPU matrix at this world size in bf16 (torch_flash through backend='auto')."""
    return [c._replace(name="gpu-" + c.name, dtype=torch.bfloat16)
            for c in configs(world) if c.dtype == F64]


def _nccl_worker(rank: int, world: int, port: int, out_path: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    report_cases(_suite_cases(gpu_configs(world), world, rank, "cuda", "auto", d=64), world,
                 rank, out_path, trace_limit=8)


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("world", NCCL_WORLDS)
def test_gpu_nccl_masks_match_reference(world, tmp_path):
    skip_unless_gpus(world)
    assert_world_passes(_nccl_worker, world, str(tmp_path), SPAWN_DEADLINE_S,
                        "CP mask NCCL group")
