"""Every public entry point against the four classes of silent traps: process state, defaults,
positional conventions shared with flash-attn / Transformer Engine / torch, and bounds.

One softmax_scale check (rocm_attn._checks.check_softmax_scale) serves every entry point: a
scale that would make every score non-finite raises ValueError naming the argument, whichever
op it reaches, instead of an all-NaN output from one op and an error from another.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import rocm_attn
from rocm_attn import attention, attn_with_cp, fused_attn_small_seq
from rocm_attn.reference import reference_attention, reference_small_seq
from helpers.cp import FakeGroup

BAD_SCALES = [float("nan"), float("inf"), -float("inf"), 1e39, 10**400, True, "0.1"]


def _thd(seed=0, d=8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(12, 4, d, generator=g, dtype=torch.float64)
    k = torch.randn(12, 2, d, generator=g, dtype=torch.float64)
    v = torch.randn(12, 2, d, generator=g, dtype=torch.float64)
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    return q, k, v, cu


def _calls():
    q, k, v, cu = _thd()
    return {
        "attention": lambda s: attention(q, k, v, cu, cu, 8, 8, softmax_scale=s),
        "attn_with_cp": lambda s: attn_with_cp(q, k, v, cu, cu, 8, 8, FakeGroup(1, 0),
                                               softmax_scale=s),
        "fused_attn_small_seq": lambda s: fused_attn_small_seq(
            q, k, v, cu, cu, 8, 8, softmax_scale=s),
        "reference_attention": lambda s: reference_attention(q, k, v, cu, cu,
                                                             softmax_scale=s),
        "reference_small_seq": lambda s: reference_small_seq(
            q[:2].unsqueeze(1).squeeze(1), k[:4].view(2, 2, 2, 8), v[:4].view(2, 2, 2, 8),
            torch.tensor([2, 1]), softmax_scale=s),
    }


@pytest.mark.parametrize("entry", sorted(_calls()))
@pytest.mark.parametrize("scale", BAD_SCALES, ids=lambda s: repr(s)[:12])
def test_every_entry_point_rejects_the_same_scales(entry, scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        _calls()[entry](scale)


@pytest.mark.parametrize("entry", sorted(_calls()))
@pytest.mark.parametrize("scale", [None, 0.0, -0.5, 3, 1e38])
def test_every_entry_point_accepts_the_same_scales(entry, scale):
    out = _calls()[entry](scale)
    out = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(out).all()


def test_attention_scale_zero_is_uniform_and_none_is_inverse_sqrt_d():
    q, k, v, cu = _thd(1)
    got = attention(q, k, v, cu, cu, 8, 8, softmax_scale=None)
    want = attention(q, k, v, cu, cu, 8, 8, softmax_scale=1 / math.sqrt(8))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# Positional conventions: arguments after the shared prefix (q, k, v, cu_seqlens_q,
# cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) mean something else in flash-attn
# (dropout_p, softmax_scale, causal) and here; they are keyword-only where a float or a bool
# could slip in silently.

def _positional_after(fn, name: str):
    params = inspect.signature(fn).parameters
    names = list(params)
    return [n for n in names[names.index(name) + 1:]
            if params[n].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]


def test_attention_takes_nothing_positional_after_max_seqlen_kv():
    """flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale,
    causal): here causal / softmax_scale are keyword-only, so 0.0 or True cannot land in them."""
    assert _positional_after(attention, "max_seqlen_kv") == []
    q, k, v, cu = _thd()
    with pytest.raises(TypeError):
        attention(q, k, v, cu, cu, 8, 8, 0.0)


def test_fused_attn_small_seq_takes_nothing_positional_after_max_seqlen_kv():
    assert _positional_after(fused_attn_small_seq, "max_seqlen_kv") == []


def test_target_attention_forward_takes_bounds_by_keyword_only():
    from rocm_attn.nn import TargetAttention

    sig = inspect.signature(TargetAttention.forward).parameters
    for name in ("seqlens", "cu_seqlens", "candidate_offsets", "max_seqlen_kv",
                 "max_candidates"):
        assert sig[name].kind is inspect.Parameter.KEYWORD_ONLY, name


# Defaults that are bounds: none of them can give NaN for a valid input.

def test_no_entry_point_defaults_a_history_bound_of_16():
    from rocm_attn.nn import TargetAttention

    sig = inspect.signature(TargetAttention.__init__).parameters
    assert sig["max_seqlen_kv"].default is None and sig["max_candidates"].default is None
    assert inspect.signature(fused_attn_small_seq).parameters["max_seqlen_kv"].default is None


@pytest.mark.parametrize("layout", ["thd_thd_thd", "bshd_bshd_bshd"])
def test_fused_attn_small_seq_default_bound_never_gives_nan(layout):
    """Histories of 17..40 keys without max_seqlen_kv: the default comes from the data (THD:
    cu_seqlens_kv read on the host; BSHD: s_kv), so nothing is NaN and nothing is counted."""
    rocm_attn.errors.read_errors(reset=True)
    g = torch.Generator().manual_seed(2)
    lens = torch.tensor([17, 40, 3], dtype=torch.int32)
    if layout == "thd_thd_thd":
        q = torch.randn(3, 2, 8, generator=g, dtype=torch.float64)
        k = torch.randn(int(lens.sum()), 2, 8, generator=g, dtype=torch.float64)
        cu_kv = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).int()
        out = fused_attn_small_seq(q, k, k, torch.arange(4, dtype=torch.int32), cu_kv)
        want = fused_attn_small_seq(q, k, k, torch.arange(4, dtype=torch.int32), cu_kv, 1, 40)
    else:
        q = torch.randn(3, 1, 2, 8, generator=g, dtype=torch.float64)
        k = torch.randn(3, 40, 2, 8, generator=g, dtype=torch.float64)
        out = fused_attn_small_seq(q, k, k, qkv_layout=layout, seqlens_kv=lens)
        want = fused_attn_small_seq(q, k, k, max_seqlen_kv=40, qkv_layout=layout,
                                    seqlens_kv=lens)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    rocm_attn.check_errors()


def test_fused_attn_small_seq_default_bound_under_compile_is_an_error():
    q, k = torch.randn(3, 2, 8), torch.randn(9, 2, 8)
    cu_q, cu_kv = (torch.tensor(x, dtype=torch.int32) for x in ([0, 1, 2, 3], [0, 2, 5, 9]))
    torch._dynamo.reset()
    f = torch.compile(lambda *a: fused_attn_small_seq(*a), fullgraph=True)
    with pytest.raises(Exception, match="max_seqlen_kv must be given"):
        f(q, k, k, cu_q, cu_kv)


def test_check_errors_without_any_call_is_clean():
    rocm_attn.errors.read_errors(reset=True)
    rocm_attn.check_errors()
    assert rocm_attn.errors.read_errors(reset=False) == (0, -1)


def test_attn_with_cp_in_transformer_engine_order_raises():
    """TE's attn_forward_func_with_cp(is_training, q, k, v, cu_q, cu_kv, max_q, max_kv,
    cu_q_padded, cu_kv_padded, dropout_p, cp_group, ...): here cp_group and cp_comm_type come
    8th and 9th, so TE's order puts tensors there, which raises naming the argument instead of
    running."""
    q, k, v, cu = _thd()
    with pytest.raises(ValueError, match="cp_comm_type|cp_group"):
        attn_with_cp(q, k, v, cu, cu, 8, 8, cu, cu, 0.0, FakeGroup(1, 0))


def test_partitioned_indices_in_transformer_engine_order_raises_on_cpu():
    """TE's thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank) against
    partitioned_indices(cu_seqlens_padded, cp, rank, total_tokens): the swapped ints raise on
    CPU tensors (values checked by default there)."""
    from rocm_attn import thd

    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    assert thd.partitioned_indices(cu, 2, 1, 16).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    for rank in (0, 1):
        with pytest.raises(ValueError):
            thd.partitioned_indices(cu, 16, 2, rank)
