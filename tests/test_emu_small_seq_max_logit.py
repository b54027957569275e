"""The small-seq kernels at ``softmax_scale * T`` on the CPU emulation (tests/helpers/emu.py):
the sharpened-LSE pass of rocm_attn.varlen.max_logit on our kernels (``fused_attn_small_seq``
reads the kernels' own row maxima instead, tests/test_emu_small_seq_row_max.py; the sharpened
pass serves its flash route, whose kernels are torch's). Their online softmax subtracts the running maximum in float32, so
the LSE at ``T = 2^16`` stays finite, and ``max LSE_T / T`` over the rows with keys is within
``ln(max_seqlen_kv) / T`` plus float32 rounding of the float64 oracle; rows without keys write
``-inf`` and padding rows are never written (NaN here: they must drop out by the key mask)."""

from __future__ import annotations

import pytest
import torch

from helpers import emu
from helpers import small_seq_tiled_cases as C
from rocm_attn.reference import reference_max_logit
from rocm_attn.varlen.max_logit import (TEMPERATURE, max_logit_from_sharpened_lse,
                                        sharpened_error_bound)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _oracle(case, lens_q, lens_kv):
    """float64 max logit over the case's segments (no mask)."""
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lens_kv).cumsum(0).tolist(), dtype=torch.int32)
    return reference_max_logit(case.q.double(), case.k.double(), cu_q, cu_kv, "no_mask",
                               softmax_scale=case.scale, cu_seqlens_q_padded=case.cu_q.int(),
                               cu_seqlens_kv_padded=case.cu_kv.int())


def _check(case, lse, lens_q, lens_kv):
    keys = torch.zeros(lse.shape[1], dtype=torch.bool)
    for i, (nq, nk) in enumerate(zip(lens_q, lens_kv)):
        if nk:
            keys[int(case.cu_q[i]):int(case.cu_q[i]) + nq] = True
    got = max_logit_from_sharpened_lse(lse, keys).double()
    want = _oracle(case, lens_q, lens_kv)
    assert not got.isnan().any(), got
    # 16-bit inputs are exact in float32; the kernel's dot products round in float32
    tol = sharpened_error_bound(case.max_kv, want.abs().max().item()) + 1e-5 * (1 + want.abs())
    err = got - want
    assert (err.abs() <= tol).all(), (err, tol)
    return err


@pytest.fixture(scope="module", params=["tiled_w64", "tiled_w32"], ids=["wave64", "wave32"])
def lib(request):
    return emu.emu_or_skip(request.param)


@pytest.mark.parametrize("boost", [1.0, 30.0])
def test_tiled_kernel_lse_at_temperature(lib, boost):
    """Mixed segments (40 queries over 300 keys down to none), GQA 2, padding rows; ``boost``
    scales the logits thirtyfold (about a hundred)."""
    lens_q, lens_kv = [1, 2, 17, 40, 0, 3], [300, 64, 17, 1, 5, 0]
    case = C.thd_case(3, lens_q, lens_kv, 4, 2, 64, torch.bfloat16, pad_before=2, pad_after=3)
    case.q = (case.q.float() * boost).to(case.q.dtype)
    lib.errors(reset=True)
    _, lse, _ = emu.small_seq_tiled_fwd(lib, case.q, case.k, case.v, case.cu_q, case.cu_kv,
                                        None, case.max_q, case.max_kv, case.scale * TEMPERATURE,
                                        return_softmax=False)
    _check(case, lse, lens_q, lens_kv)
    assert lib.errors() == (0, 0)


def test_tiled_kernel_tied_maxima_reach_the_bound(lib):
    """Every key of a segment equal: each row's n keys tie, LSE_T / T = m + ln(n) / T, which the
    kernel reproduces (so the documented bound is the error, not a loose cover)."""
    lens_q, lens_kv = [3, 2], [256, 256]
    case = C.thd_case(4, lens_q, lens_kv, 2, 1, 64, torch.bfloat16)
    case.k[:256] = case.k[0]
    case.k[256:] = case.k[256]  # two segments, 256 equal keys each
    _, lse, _ = emu.small_seq_tiled_fwd(lib, case.q, case.k, case.v, case.cu_q, case.cu_kv,
                                        None, case.max_q, case.max_kv, case.scale * TEMPERATURE,
                                        return_softmax=False)
    err = _check(case, lse, lens_q, lens_kv)
    assert (err > 0.5 * torch.log(torch.tensor(256.0)).item() / TEMPERATURE).all(), err
