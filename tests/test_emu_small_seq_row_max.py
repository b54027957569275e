"""Each row's maximum scaled logit written by the small-seq forward kernels (params ``row_max``,
what ``fused_attn_small_seq(return_max_logit=True)`` reduces per head on a GPU), on the CPU
emulation (tests/helpers/emu.py) at 64 lanes (MFMA code paths) and 32 lanes, against a float64
max over each row's scores.

Per row: ``scale * max_j q . k_j`` within float32 rounding (the tiled kernels' ROW_MAX instances
keep each row's exact running maximum apart from the softmax's lazy reference, which they leave
as the plain instances have it), ``-inf`` for rows without keys and padding rows, NaN for a bad
segment's rows (as its LSE), and never above the row's LSE (nor below ``LSE - ln(n_keys)``);
per head, :func:`rocm_attn.small_seq.max_logit_from_row_max` is the oracle's max logit. Outputs
start as NaN, so an unwritten row fails. Families: the one-query kernels (general and MFMA), the
tiled wave, block and resident kernels (the warpgroup kernels are sm_90a only:
tests/test_small_seq_row_max_gpu.py runs them on a GPU).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import emu
from helpers import small_seq_tiled_cases as C

from rocm_attn.small_seq import max_logit_from_row_max

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _oracle_rows(q, k, rows_of, scale):
    """float64 ``[h_q, rows]`` row maxima: ``rows_of`` lists (q rows, k rows) per valid segment
    (q as [rows, h_q, d], k as [kv rows, h_kv, d]); every other row -inf."""
    h_q, h_kv = q.shape[1], k.shape[1]
    g = h_q // h_kv
    ref = torch.full((h_q, q.shape[0]), -math.inf, dtype=torch.float64)
    for qr, kr in rows_of:
        if len(qr) == 0 or len(kr) == 0:
            continue
        qs = q[qr].double()  # [n, h_q, d]
        ks = k[kr].double().repeat_interleave(g, dim=1)  # [m, h_q, d]
        sc = torch.einsum("nhd,mhd->hnm", qs, ks) * scale
        ref[:, qr] = sc.amax(dim=2)
    return ref


def _check_rows(got, ref, lse, nan_rows=None, skip_rows=None, n_keys=None):
    """Row maxima against the oracle (NaN exactly on nan_rows; skip_rows unchecked), and
    ``LSE - ln(n_keys) <= row_max <= LSE`` on rows with keys."""
    keep = torch.ones(got.shape[1], dtype=torch.bool)
    if skip_rows is not None:
        keep &= ~skip_rows
    if nan_rows is not None:
        assert got[:, nan_rows].isnan().all(), got[:, nan_rows]
        keep &= ~nan_rows
    g, r = got[:, keep].double(), ref[:, keep]
    assert not g.isnan().any(), g
    inf = r == -math.inf
    assert (g[inf] == -math.inf).all(), g[inf]
    fin = ~inf
    assert torch.isfinite(g[fin]).all(), g[fin]
    err = (g[fin] - r[fin]).abs()
    tol = 2e-5 * (1 + r[fin].abs())
    assert (err <= tol).all(), (err.max(), (err - tol).max())
    if n_keys is not None:
        lse_k = lse[:, keep].double()
        nk = n_keys[keep].double().clamp(min=1).log().unsqueeze(0).expand_as(lse_k)
        slack = 1e-4 * (1 + r.abs())
        assert (g[fin] <= lse_k[fin] + slack[fin]).all()
        assert (g[fin] >= lse_k[fin] - nk[fin] - slack[fin]).all()


def _check_heads(got_rows, ref, nan_rows=None, skip_rows=None):
    """The per-head reduction of the kernel's rows against the oracle's max logit."""
    rows = got_rows
    if skip_rows is not None:  # rows the contract leaves unspecified: not part of the call
        rows = rows[:, ~skip_rows]
        ref = ref[:, ~skip_rows]
    got = max_logit_from_row_max(rows)
    if nan_rows is not None and nan_rows.any():
        assert got.isnan().all(), got
        return
    want = ref.amax(dim=1) if ref.shape[1] else torch.full((ref.shape[0],), -math.inf)
    assert not got.isnan().any(), got
    assert torch.equal(got == -math.inf, want == -math.inf), (got, want)
    fin = want != -math.inf
    assert ((got[fin].double() - want[fin]).abs() <= 2e-5 * (1 + want[fin].abs())).all(), \
        (got, want)


# --------------------------------------------------------------------------------------------
# tiled kernels
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["tiled_w64", "tiled_w32"], ids=["wave64", "wave32"])
def tiled_lib(request):
    return emu.emu_or_skip(request.param)


# the launcher's choice, the wave kernel alone, the block kernel, the resident kernel (as
# tests/test_emu_small_seq_tiled.py forces them)
TILED_KERNELS = {
    "auto": {},
    "wave": {"small_seq_tiled_block": 0, "small_seq_tiled_resident": 0},
    "block": {"small_seq_tiled_block": 2, "small_seq_tiled_resident": 0},
    "resident": {"small_seq_tiled_resident": 2},
}


def _tiled_rows_of(case, segs):
    rows_of = []
    for s in segs.valid:
        rows_of.append((list(range(s.q0, s.q0 + s.nq)), list(range(s.k0, s.k0 + s.nk))))
    return rows_of


def _tiled_n_keys(case, segs):
    n = torch.zeros(case.total_q, dtype=torch.int64)
    for s in segs.valid:
        n[s.q0:s.q0 + s.nq] = s.nk
    return n


def _run_tiled(lib, case):
    lib.errors(reset=True)
    out, lse, _, rmax = emu.small_seq_tiled_fwd(lib, *case.args(), return_softmax=False,
                                                row_max=True)
    return out, lse, rmax


@pytest.mark.parametrize("kernel", list(TILED_KERNELS))
@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (4, 2), (8, 1)], ids=["g1", "g2", "g8"])
def test_tiled_row_max_ragged(tiled_lib, h_q, h_kv, kernel):
    """Ragged THD segments: 0, 1, 17, 40 queries over 0, 1, 17, 64, 96 keys, GQA, padding rows
    before and after; the per-row maxima and the per-head reduction."""
    lens_q, lens_kv = [1, 2, 17, 40, 0, 3, 1, 5], [96, 64, 17, 1, 5, 0, 1, 33]
    case = C.thd_case(7 + h_q, lens_q, lens_kv, h_q, h_kv, 64, torch.bfloat16, pad_before=2,
                      pad_after=3)
    with emu.tuning(**TILED_KERNELS[kernel]):
        _, lse, rmax = _run_tiled(tiled_lib, case)
    assert tiled_lib.errors() == (0, 0)
    segs = C.contract_segments(case)
    q, k, _ = C.flat_heads(case)
    ref = _oracle_rows(q, k, _tiled_rows_of(case, segs), case.scale)
    _check_rows(rmax, ref, lse, n_keys=_tiled_n_keys(case, segs))
    _check_heads(rmax, ref)


@pytest.mark.parametrize("d", [128, 256])
def test_tiled_row_max_long_history_and_scale(tiled_lib, d):
    """Several key tiles (the lazy reference max lags the exact one: the written max must not),
    logits boosted so the later tiles' maxima move past the first tile's by more than the lazy
    threshold, and a negative scale (the max of the scaled scores)."""
    lens_q, lens_kv = [3, 17, 1], [300, 129, 40]
    case = C.thd_case(d, lens_q, lens_kv, 4, 2, d, torch.bfloat16)
    # the last keys of each segment aligned with the queries: rising maxima along the history
    k0 = 0
    for n in lens_kv:
        case.k[k0 + n - 5:k0 + n] = (case.k[k0 + n - 5:k0 + n].float() * 6).to(case.k.dtype)
        k0 += n
    for scale in (case.scale * 4, -case.scale):
        case.scale = scale
        _, lse, rmax = _run_tiled(tiled_lib, case)
        segs = C.contract_segments(case)
        q, k, _ = C.flat_heads(case)
        ref = _oracle_rows(q, k, _tiled_rows_of(case, segs), scale)
        _check_rows(rmax, ref, lse, n_keys=_tiled_n_keys(case, segs))
        _check_heads(rmax, ref)


def test_tiled_row_max_bshd(tiled_lib):
    """BSHD: rows of a segment with no keys are -inf, every row is written."""
    case = C.bshd_case(3, 5, [7, 0, 1, 20], 20, 4, 2, 64, torch.bfloat16)
    _, lse, rmax = _run_tiled(tiled_lib, case)
    segs = C.contract_segments(case)
    q, k, _ = C.flat_heads(case)
    ref = _oracle_rows(q, k, _tiled_rows_of(case, segs), case.scale)
    _check_rows(rmax, ref, lse, n_keys=_tiled_n_keys(case, segs))
    _check_heads(rmax, ref)


def test_tiled_row_max_bad_segment_is_nan_and_isolated(tiled_lib):
    """A segment longer than max_seqlen_kv breaks the contract: its rows are NaN (as its LSE),
    the other segments' rows exact; the per-head reduction is NaN (as the sharpened pass's)."""
    lens_q, lens_kv = [2, 3, 4], [5, 30, 6]
    case = C.thd_case(11, lens_q, lens_kv, 4, 2, 64, torch.bfloat16, max_kv=16)
    _, lse, rmax = _run_tiled(tiled_lib, case)
    segs = C.contract_segments(case)
    assert segs.bad == [1]
    q, k, _ = C.flat_heads(case)
    ref = _oracle_rows(q, k, _tiled_rows_of(case, segs), case.scale)
    _check_rows(rmax, ref, lse, nan_rows=segs.nan_rows, skip_rows=segs.unspecified)
    assert lse[:, segs.nan_rows].isnan().all()
    _check_heads(rmax, ref, nan_rows=segs.nan_rows, skip_rows=segs.unspecified)
    tiled_lib.errors(reset=True)


def _rising_case(seed, lens_q, lens_kv, h_q, h_kv, d, rise):
    """A THD case whose scores rise along each segment's keys: every key gets ``t x`` a
    direction shared by all queries (t from 0 to 1 along the segment) on top of its random
    part, scaled so that each query's scores climb by about ``rise`` (natural units) over the
    history. A rise below the lazy threshold (8 in the log2 domain: 5.5) never moves the
    softmax's reference maximum after the first key tile; a larger one moves it every few
    tiles (rescales)."""
    case = C.thd_case(seed, lens_q, lens_kv, h_q, h_kv, d, torch.bfloat16, pad_before=1)
    gen = torch.Generator().manual_seed(seed + 1)
    u = torch.randn(d, generator=gen)
    u = u / u.norm()
    q = case.q.float()
    q += (4.0 - q @ u).unsqueeze(-1) * u  # every query's component along u is 4 ...
    case.q = q.to(case.q.dtype)
    k0 = 0
    for n in lens_kv:  # ... and the keys climb along u
        t = torch.linspace(0.0, 1.0, n).view(n, 1, 1) if n > 1 else torch.zeros(n, 1, 1)
        k = case.k[k0:k0 + n].float() * 0.25
        case.k[k0:k0 + n] = (k + t * (rise / (4.0 * case.scale)) * u).to(case.k.dtype)
        k0 += n
    return case


@pytest.mark.parametrize("kernel", list(TILED_KERNELS))
@pytest.mark.parametrize("rise", [4.0, 60.0], ids=["no_rescale", "rescales"])
def test_tiled_row_max_rising_scores(tiled_lib, kernel, rise):
    """Scores rising along long histories (many key tiles): within the lazy threshold the
    softmax's reference maximum stays at the first tile's (a row_max taken from it would be ~4
    low), past it the reference moves every few tiles. The written row maxima are the exact
    ones, and out and LSE are bit for bit those of the call without row_max (the ROW_MAX
    instances rescale exactly as the plain ones: at 64 lanes, a reference that moved with every
    new maximum would change their rounding)."""
    case = _rising_case(3, [3, 17, 2], [300, 129, 40], 4, 2, 128, rise)
    with emu.tuning(**TILED_KERNELS[kernel]):
        tiled_lib.errors(reset=True)
        out0, lse0, _ = emu.small_seq_tiled_fwd(tiled_lib, *case.args(), return_softmax=False)
        out1, lse1, rmax = _run_tiled(tiled_lib, case)
    assert tiled_lib.errors() == (0, 0)
    segs = C.contract_segments(case)
    q, k, _ = C.flat_heads(case)
    ref = _oracle_rows(q, k, _tiled_rows_of(case, segs), case.scale)
    fin = ref != -math.inf
    first_tile = _oracle_rows(q, k, [(qr, kr[:16]) for qr, kr in _tiled_rows_of(case, segs)],
                              case.scale)
    assert (ref[fin] - first_tile[fin]).min() > 0.25 * rise  # the maxima do move
    _check_rows(rmax, ref, lse1, n_keys=_tiled_n_keys(case, segs))
    _check_heads(rmax, ref)
    C.check(case, out1, lse1, None, "row_max", expect_bad=[])
    assert torch.equal(out1.view(torch.int16), out0.view(torch.int16))
    assert torch.equal(lse1, lse0)


def test_tiled_launcher_runs_the_records_instance(tiled_lib):
    """The launcher runs the instance the plan's record names (its last parameter, ROW_MAX): for
    a call that asks for row maxima the wave kernel's ROW_MAX twin (``<T, D, false, true>``),
    else its plain instance, and for histories of one key tile the one-tile instance, which has
    no twin; a record naming the one-tile instance's twin is refused (hipErrorNotSupported) and
    nothing is written."""
    from rocm_attn import small_seq_plan as sp

    wave = {"small_seq_tiled_block": 0, "small_seq_tiled_resident": 0}
    long = C.thd_case(21, [5, 9], [40, 33], 4, 2, 64, torch.bfloat16)
    short = C.thd_case(22, [5, 9], [16, 3], 4, 2, 64, torch.bfloat16)
    with emu.tuning(**wave):
        for case, row_max, want in ((long, True, "false, true>"), (long, False, "false, false>"),
                                    (short, True, "true, false>")):
            tiled_lib.mark_kernels()
            emu.small_seq_tiled_fwd(tiled_lib, *case.args(), return_softmax=False, row_max=row_max)
            ran = [k for k in tiled_lib.kernels_run(since_mark=True) if "small_seq_tiled_fwd" in k]
            assert ran and all(k.endswith(want) for k in ran), (row_max, ran)
        plan = emu.tiled_fwd_plan(tiled_lib, short.q, short.k, short.max_q, short.max_kv, False,
                                  max_logit=True)
        record = plan[2:2 + sp.LAUNCH_INTS]  # id, D, ONE_TILE, grid_factor, ROW_MAX
        assert record[:3] == [sp.KERNEL_IDS["tiled_fwd_wave"], 64, 1] and record[4] == 0
        bad = list(plan)
        bad[2 + 4] = 1
        rc = []
        out, lse, _, rmax = emu.small_seq_tiled_fwd(tiled_lib, *short.args(), return_softmax=False,
                                                    row_max=True, plan=bad, rc=rc)
    assert rc == [emu.HIP_ERROR_NOT_SUPPORTED]
    assert out.isnan().all() and lse.isnan().all() and rmax.isnan().all()


# --------------------------------------------------------------------------------------------
# one-query kernels
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["w64", "w32"], ids=["wave64", "wave32"])
def one_lib(request):
    return emu.emu_or_skip(request.param)


ONE_QUERY_MODES = {"launcher": {}, "general": {"small_seq_mma": 0, "small_seq_pipe": 0}}


def _one_query_case(seed, lens, h_q, h_kv, d, max_kv, bad=()):
    gen = torch.Generator().manual_seed(seed)
    b = len(lens)
    total_kv = sum(lens)
    q = torch.randn(b, h_q, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(total_kv, h_kv, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(total_kv, h_kv, d, generator=gen).to(torch.bfloat16)
    cu_q = torch.arange(b + 1, dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    for i in bad:  # a query count of 2 breaks the one-query contract
        cu_q[i + 1:] += 1
    return q, k, v, cu_q, cu_kv


@pytest.mark.parametrize("mode", list(ONE_QUERY_MODES))
@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2)], ids=["g1", "g4"])
@pytest.mark.parametrize("d,max_kv", [(64, 16), (128, 4), (512, 8)])
def test_one_query_row_max(one_lib, mode, d, max_kv, h_q, h_kv):
    """Segments of 0, 1 and up to max_seqlen_kv keys, GQA."""
    lens = [0, 1, max_kv, max_kv - 1, 2, max_kv, 0, 3][:8]
    lens = [min(n, max_kv) for n in lens]
    q, k, v, cu_q, cu_kv = _one_query_case(d + max_kv + h_q, lens, h_q, h_kv, d, max_kv)
    if not emu.small_seq_compiled(one_lib.wave, "fwd", q.dtype, d, max_kv):
        pytest.skip("variant not in the emulation build")
    scale = d ** -0.5 * 3
    one_lib.errors(reset=True)
    with emu.tuning(**ONE_QUERY_MODES[mode]):
        _, lse, _, rmax = emu.small_seq_fwd(one_lib, q, k, v, cu_q, cu_kv, None, max_kv, scale,
                                            return_softmax=False, row_max=True)
    assert one_lib.errors() == (0, 0)
    ks = cu_kv.tolist()
    rows_of = [([i], list(range(ks[i], ks[i + 1]))) for i in range(len(lens))]
    ref = _oracle_rows(q, k, rows_of, scale)
    _check_rows(rmax, ref, lse, n_keys=torch.tensor(lens))
    _check_heads(rmax, ref)


def test_one_query_row_max_bad_segment(one_lib):
    """A segment with two query rows breaks the contract: its rows are NaN like its LSE."""
    lens = [3, 5, 2, 4]
    q, k, v, cu_q, cu_kv = _one_query_case(1, lens, 4, 2, 64, 8, bad=(1,))
    one_lib.errors(reset=True)
    _, lse, _, rmax = emu.small_seq_fwd(one_lib, q, k, v, cu_q, cu_kv, None, 8, 0.125,
                                        return_softmax=False, row_max=True)
    assert one_lib.errors()[0] >= 1
    assert lse[:, 1].isnan().all() and rmax[:, 1].isnan().all()
    assert not rmax[:, [0]].isnan().any()
    assert max_logit_from_row_max(rmax).isnan().all()
