"""Jagged inputs as torchrec and FBGEMM hand them over (rocm_attn/jagged.py): TargetAttention
and fused_attn_small_seq_jagged on torchrec JaggedTensor (offsets, lengths or both), packed rows
with lengths only and int64 offsets, against a float64 per-user loop. The torchrec tests skip
without torchrec (CI installs the versions pyproject's torchrec extra pins); a stand-in with
JaggedTensor's accessors covers the same paths everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import rocm_attn
from rocm_attn.jagged import fused_attn_small_seq_jagged, is_jagged
from rocm_attn.nn import TargetAttention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_nn import _request_reference  # noqa: E402  (the float64 per-user oracle)


class StandIn:
    """The accessors of torchrec's JaggedTensor that rocm_attn reads, and nothing else."""

    def __init__(self, values, offsets=None, lengths=None):
        self._values, self._offsets, self._lengths = values, offsets, lengths

    def values(self):
        return self._values

    def offsets_or_none(self):
        return self._offsets

    def lengths_or_none(self):
        return self._lengths


def _torchrec():
    return pytest.importorskip("torchrec.sparse.jagged_tensor")


def _problem(seed, users=6, e=32, max_hist=12, max_cand=5, dtype=torch.float64):
    """A request with a user of no candidates, one of no history, one of neither."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_cand + 1, (users,), generator=gen)
    lens = torch.randint(1, max_hist + 1, (users,), generator=gen)
    counts[0], lens[1], counts[2], lens[2] = 0, 0, 0, 0
    cand_offsets = F.pad(counts.cumsum(0), (1, 0))
    candidate = torch.randn(int(counts.sum()), e, generator=gen, dtype=dtype)
    histories = [torch.randn(int(n), e, generator=gen, dtype=dtype) for n in lens]
    return candidate, cand_offsets, histories, lens


def _module(seed=0, e=32, num_kv_heads=2, dtype=torch.float64):
    torch.manual_seed(seed)
    # both bounds given, as traced and exported modules need them (_problem's largest counts)
    return TargetAttention(e, num_heads=4, num_kv_heads=num_kv_heads, max_seqlen_kv=12,
                           max_candidates=5, dtype=dtype)


@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
def test_lengths_only_packed_history(lengths_dtype):
    """Packed rows with lengths only (no offsets): the request and the one-candidate form."""
    module = _module()
    candidate, offsets, histories, lens = _problem(1)
    packed, lens = torch.cat(histories), lens.to(lengths_dtype)
    want = _request_reference(module, candidate, offsets, histories)
    got = module(candidate, packed, lengths=lens, candidate_offsets=offsets)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # one candidate per user
    pairs = torch.randn(len(histories), 32, dtype=torch.float64)
    want = _request_reference(module, pairs, torch.arange(len(histories) + 1), histories)
    torch.testing.assert_close(module(pairs, packed, lengths=lens), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("carries", ["offsets", "lengths", "both"])
@pytest.mark.parametrize("offset_dtype", [torch.int32, torch.int64])
def test_jagged_history_and_candidates_stand_in(carries, offset_dtype):
    module = _module(num_kv_heads=1)
    candidate, offsets, histories, lens = _problem(2)
    want = _request_reference(module, candidate, offsets, histories)
    cu = F.pad(lens.cumsum(0), (1, 0)).to(offset_dtype)
    parts = {"offsets": dict(offsets=cu), "lengths": dict(lengths=lens.to(offset_dtype)),
             "both": dict(offsets=cu, lengths=lens.to(offset_dtype))}[carries]
    history = StandIn(torch.cat(histories), **parts)
    assert is_jagged(history) and not is_jagged(torch.cat(histories))
    got = module(candidate, history, candidate_offsets=offsets.to(offset_dtype))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the candidates jagged too: their offsets are the request's candidate_offsets
    got = module(StandIn(candidate, lengths=offsets.diff()), history)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_torchrec_jagged_tensor_inputs():
    jt = _torchrec()
    module = _module(num_kv_heads=4)
    candidate, offsets, histories, lens = _problem(3)
    want = _request_reference(module, candidate, offsets, histories)
    packed = torch.cat(histories)
    for history in (jt.JaggedTensor(values=packed, lengths=lens),
                    jt.JaggedTensor(values=packed, offsets=F.pad(lens.cumsum(0), (1, 0))),
                    jt.JaggedTensor(values=packed, lengths=lens.int())):
        got = module(candidate, history, candidate_offsets=offsets)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        got = module(jt.JaggedTensor(values=candidate, lengths=offsets.diff()), history)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_fbgemm_int64_offsets_as_they_come():
    """Offsets from FBGEMM's complete cumsum (int64) go in with no conversion."""
    pytest.importorskip("fbgemm_gpu")
    module = _module()
    candidate, offsets, histories, lens = _problem(4)
    cu = torch.ops.fbgemm.asynchronous_complete_cumsum(lens)
    cand_offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(offsets.diff())
    assert cu.dtype == cand_offsets.dtype == torch.int64
    got = module(candidate, torch.cat(histories), cu_seqlens=cu, candidate_offsets=cand_offsets)
    torch.testing.assert_close(got, _request_reference(module, candidate, offsets, histories),
                               rtol=1e-10, atol=1e-10)


def test_keyed_jagged_tensor_is_refused_naming_the_fix():
    jt = _torchrec()
    module = _module()
    kjt = jt.KeyedJaggedTensor(keys=["history"], values=torch.arange(3),
                               lengths=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="history is a KeyedJaggedTensor.*one feature"):
        module(torch.randn(2, 32, dtype=torch.float64), kjt)


@pytest.mark.parametrize("kwargs, match", [
    (dict(seqlens=torch.tensor([1, 2])), "jagged history carries its own offsets"),
    (dict(cu_seqlens=torch.tensor([0, 1, 3])), "jagged history carries its own offsets"),
    (dict(lengths=torch.tensor([1, 2])), "pass no lengths with it"),
])
def test_jagged_history_with_offsets_too_is_refused(kwargs, match):
    module = _module()
    history = StandIn(torch.randn(3, 32, dtype=torch.float64), lengths=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=match):
        module(torch.randn(2, 32, dtype=torch.float64), history, **kwargs)


def test_bad_jagged_parts_are_named():
    module = _module()
    cand = torch.randn(2, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match="history carries neither offsets nor lengths"):
        module(cand, StandIn(torch.randn(3, 32, dtype=torch.float64)))
    with pytest.raises(ValueError, match=r"history.lengths\(\) must be a 1-D int32 or int64"):
        module(cand, StandIn(torch.randn(3, 32, dtype=torch.float64),
                             lengths=torch.tensor([1.0, 2.0])))
    with pytest.raises(ValueError, match="lengths must be a 1-D int32 or int64"):
        module(cand, torch.randn(3, 32, dtype=torch.float64), lengths=torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="lengths go with a packed history"):
        module(cand, torch.randn(2, 3, 32, dtype=torch.float64), lengths=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="one of seqlens .* got seqlens and lengths"):
        module(cand, torch.randn(3, 32, dtype=torch.float64), lengths=torch.tensor([1, 2]),
               seqlens=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="jagged candidate carries its own offsets"):
        module(StandIn(cand, lengths=torch.tensor([1, 1])), torch.randn(3, 32,
               dtype=torch.float64), seqlens=torch.tensor([1, 2]),
               candidate_offsets=torch.tensor([0, 1, 2]))


def test_lengths_only_request_under_torch_compile_fullgraph():
    module = _module(dtype=torch.float32)
    candidate, offsets, histories, lens = _problem(5, dtype=torch.float32)
    packed = torch.cat(histories)
    want = module(candidate, packed, lengths=lens, candidate_offsets=offsets)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    got = compiled(candidate, StandIn(packed, lengths=lens), candidate_offsets=offsets)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled(candidate, packed, lengths=lens,
                                        candidate_offsets=offsets), want, rtol=1e-6, atol=1e-6)


def test_torchrec_jagged_tensor_under_torch_compile_fullgraph():
    jt = _torchrec()
    module = _module(dtype=torch.float32)
    candidate, offsets, histories, lens = _problem(6, dtype=torch.float32)
    packed = torch.cat(histories)
    want = module(candidate, packed, lengths=lens, candidate_offsets=offsets)

    def score(cand, values, lengths, cand_lengths):
        return module(jt.JaggedTensor(values=cand, lengths=cand_lengths),
                      jt.JaggedTensor(values=values, lengths=lengths))

    got = torch.compile(score, backend="eager", fullgraph=True)(candidate, packed, lens,
                                                               offsets.diff())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _small_seq_reference(q, k, v, cu_q, cu_kv):
    outs = []
    for i in range(cu_kv.numel() - 1):
        qi = q[int(cu_q[i]):int(cu_q[i + 1])].double()
        ki, vi = (t[int(cu_kv[i]):int(cu_kv[i + 1])].double() for t in (k, v))
        if ki.shape[0] == 0:
            outs.append(torch.zeros_like(qi))
            continue
        ki, vi = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (ki, vi))
        w = torch.einsum("qhd,khd->hqk", qi, ki).mul(q.shape[-1] ** -0.5).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", w, vi))
    return torch.cat(outs)


@pytest.mark.parametrize("form", ["lengths", "offsets64", "stand_in"])
def test_fused_attn_small_seq_jagged(form):
    gen = torch.Generator().manual_seed(7)
    b, h, hk, d = 5, 4, 2, 16
    q_lens = torch.tensor([2, 0, 3, 1, 4])
    kv_lens = torch.tensor([3, 5, 0, 1, 16])
    q = torch.randn(int(q_lens.sum()), h, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(int(kv_lens.sum()), hk, d, generator=gen, dtype=torch.float64)
            for _ in range(2))
    cu_q, cu_kv = F.pad(q_lens.cumsum(0), (1, 0)), F.pad(kv_lens.cumsum(0), (1, 0))
    want = _small_seq_reference(q, k, v, cu_q, cu_kv)
    if form == "lengths":
        got = fused_attn_small_seq_jagged(q, k, v, q_lengths=q_lens, kv_lengths=kv_lens,
                                          max_seqlen_kv=16)
    elif form == "offsets64":
        got = fused_attn_small_seq_jagged(q, k, v, q_offsets=cu_q, kv_offsets=cu_kv,
                                          max_seqlen_kv=16, max_seqlen_q=4)
    else:
        got = fused_attn_small_seq_jagged(StandIn(q, lengths=q_lens),
                                          StandIn(k, offsets=cu_kv), StandIn(v, offsets=cu_kv),
                                          max_seqlen_kv=16)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # one query per segment: q without offsets, lse asked for through the op's keywords
    q1 = q[:b]
    out, lse = fused_attn_small_seq_jagged(q1, k, v, kv_lengths=kv_lens, max_seqlen_kv=16,
                                           return_lse=True)
    torch.testing.assert_close(out, _small_seq_reference(q1, k, v, torch.arange(b + 1), cu_kv),
                               rtol=1e-10, atol=1e-10)
    assert torch.isneginf(lse[:, 2]).all() and torch.isfinite(lse[:, [0, 1, 3, 4]]).all()


def test_fused_attn_small_seq_jagged_bad_arguments():
    q = torch.randn(2, 1, 8)
    k = torch.randn(3, 1, 8)
    with pytest.raises(ValueError, match="keys' segments are needed"):
        fused_attn_small_seq_jagged(q, k, k, max_seqlen_kv=4)
    with pytest.raises(ValueError, match="one of q_offsets or q_lengths"):
        fused_attn_small_seq_jagged(q, k, k, q_offsets=torch.tensor([0, 2]),
                                    q_lengths=torch.tensor([2]), kv_lengths=torch.tensor([3]),
                                    max_seqlen_kv=4)
    with pytest.raises(ValueError, match="max_seqlen_q must be 1 or None"):
        fused_attn_small_seq_jagged(q, k, k, kv_lengths=torch.tensor([1, 2]), max_seqlen_kv=4,
                                    max_seqlen_q=3)


def test_public_and_torchrec_free():
    """rocm_attn.jagged is public and importing rocm_attn loads neither torchrec nor FBGEMM."""
    assert rocm_attn.jagged.fused_attn_small_seq_jagged is fused_attn_small_seq_jagged
    code = ("import sys, rocm_attn; bad = [m for m in ('torchrec', 'fbgemm_gpu') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


class _DataDependentRequest(torch.nn.Module):
    """A request whose row counts come from the data, as a jagged pipeline's split makes them
    (torchrec's KeyedJaggedTensor under export): unbacked sizes in the traced graph."""

    def __init__(self, att):
        super().__init__()
        self.att = att

    def forward(self, candidate, history, counts, lengths):
        n, t = counts.sum().item(), lengths.sum().item()
        cand, hist = candidate.narrow(0, 0, n), history.narrow(0, 0, t)
        return self.att(StandIn(cand, lengths=counts), StandIn(hist, lengths=lengths),
                        max_candidates=16)


def test_export_with_data_dependent_row_counts():
    """The torch path guards on no row count: the program exports and serves requests with
    other counts, one without any history row among them."""
    torch.manual_seed(11)
    att = TargetAttention(32, num_heads=4, num_kv_heads=2, head_dim=8, max_seqlen_kv=64).eval()
    model = _DataDependentRequest(att)

    def request(counts, lengths):
        counts, lengths = torch.tensor(counts), torch.tensor(lengths)
        return (torch.randn(int(counts.sum()) + 3, 32), torch.randn(int(lengths.sum()) + 2, 32),
                counts, lengths)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-kernels export warning
        rows = {0: torch.export.Dim.AUTO}
        program = torch.export.export(model, request([2, 5, 1], [7, 0, 30]), strict=False,
                                      dynamic_shapes=(rows, rows, None, None))
    for counts, lengths in (([3, 1, 4], [1, 64, 9]), ([1, 2, 1], [0, 0, 0])):
        inputs = request(counts, lengths)
        with torch.no_grad():
            got, want = program.module()(*inputs), model(*inputs)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
