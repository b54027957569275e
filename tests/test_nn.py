"""rocm_attn.nn.TargetAttention against a hand-written float64 computation."""

from __future__ import annotations

import pytest
import torch

from rocm_attn.nn import TargetAttention
from rocm_attn.reference import reference_small_seq


def _manual(module, candidate, history, seqlens):
    """Projections + float64 oracle + output projection, written out."""
    b, s, _ = history.shape
    h, hk, d = module.num_heads, module.num_kv_heads, module.head_dim
    q = module.q_proj(candidate).view(b, h, d)
    kv = module.kv_proj(history).view(b, s, 2, hk, d)
    out, _, _ = reference_small_seq(q, kv[:, :, 0], kv[:, :, 1], seqlens)
    return module.out_proj(out.reshape(b, h * d).to(candidate.dtype))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_padded_and_packed_histories_match_manual(seed, num_kv_heads):
    torch.manual_seed(seed)
    b, s, e = 37, 16, 64
    module = TargetAttention(e, num_heads=4, num_kv_heads=num_kv_heads, dtype=torch.float64)
    candidate = torch.randn(b, e, dtype=torch.float64)
    history = torch.randn(b, s, e, dtype=torch.float64)
    seqlens = torch.randint(0, s + 1, (b,), dtype=torch.int32)
    want = _manual(module, candidate, history, seqlens)
    got = module(candidate, history, seqlens=seqlens)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the same histories packed: only the valid rows, back to back
    packed = torch.cat([history[i, : int(seqlens[i])] for i in range(b)])
    cu = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    torch.testing.assert_close(module(candidate, packed, cu_seqlens=cu), want, rtol=1e-10, atol=1e-10)


def test_gradients_reach_every_parameter():
    torch.manual_seed(3)
    module = TargetAttention(32, num_heads=2, head_dim=16)
    candidate, history = torch.randn(9, 32), torch.randn(9, 5, 32)
    seqlens = torch.tensor([0, 1, 2, 3, 4, 5, 5, 1, 2], dtype=torch.int32)
    module(candidate, history, seqlens=seqlens).square().sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_kv_heads"):
        TargetAttention(64, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="max_seqlen_kv"):
        TargetAttention(64, num_heads=4, max_seqlen_kv=16.0)
    module = TargetAttention(16, num_heads=2)
    with pytest.raises(ValueError, match="exactly one of seqlens"):
        module(torch.randn(2, 16), torch.randn(2, 3, 16))


@pytest.mark.gpu
def test_kernel_path_matches_torch_path_on_gpu():
    import rocm_attn._ext as ext

    if not (torch.cuda.is_available() and ext.HAS_EXTENSION):
        pytest.skip("needs a GPU and the compiled extension")
    torch.manual_seed(4)
    module = TargetAttention(256, num_heads=4, num_kv_heads=2, device="cuda", dtype=torch.bfloat16)
    candidate = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16)
    history = torch.randn(1000, 16, 256, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.randint(0, 17, (1000,), dtype=torch.int32, device="cuda")
    module.backend = "kernel"  # k/v are strided views of the fused projection: no copy
    got = module(candidate, history, seqlens=seqlens)
    module.backend = "torch"
    want = module(candidate, history, seqlens=seqlens)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 2e-2, err


def _bad(match, ident, **kwargs):
    return pytest.param({"embed_dim": 64, "num_heads": 4, **kwargs}, match, id=ident)


_BAD_CONSTRUCTOR = [
    _bad("num_heads", "heads0", num_heads=0),
    _bad("num_heads", "heads-2", num_heads=-2),
    _bad("num_heads", "heads_float", num_heads=4.0),
    _bad("embed_dim", "embed0", embed_dim=0),
    _bad("head_dim", "head_dim0", head_dim=0),
    _bad("head_dim", "head_dim-16", head_dim=-16),
    _bad("head_dim", "default_head_dim0", embed_dim=2),  # 2 // 4 = 0
    _bad("num_kv_heads", "kv_heads0", num_kv_heads=0),
    _bad("num_kv_heads", "kv_heads-2", num_kv_heads=-2),
    _bad("kv_embed_dim", "kv_embed0", kv_embed_dim=0),
    _bad("max_seqlen_kv", "max_seqlen_kv0", max_seqlen_kv=0),
    _bad("backend", "backend_cuda", backend="cuda"),
]


@pytest.mark.parametrize("kwargs,match", _BAD_CONSTRUCTOR)
def test_bad_constructor_arguments_are_value_errors(kwargs, match):
    """Zero or negative sizes are errors naming the argument (0 is not "unset")."""
    with pytest.raises(ValueError, match=match):
        TargetAttention(**kwargs)


def _bad_inputs():
    b, s, e = 3, 4, 16
    seqlens = torch.tensor([1, 4, 0], dtype=torch.int32)
    cu = torch.tensor([0, 1, 5, 5], dtype=torch.int32)
    return [
        ("candidate_width", (torch.randn(b, e + 1), torch.randn(b, s, e)), dict(seqlens=seqlens),
         "candidate"),
        ("candidate_rank", (torch.randn(b, 1, e), torch.randn(b, s, e)), dict(seqlens=seqlens),
         "candidate"),
        ("history_width", (torch.randn(b, e), torch.randn(b, s, e - 1)), dict(seqlens=seqlens),
         "history"),
        ("batch_mismatch", (torch.randn(b, e), torch.randn(b + 1, s, e)),
         dict(seqlens=seqlens), "history batch"),
        ("padded_rank", (torch.randn(b, e), torch.randn(b * s, e)), dict(seqlens=seqlens),
         "history"),
        ("packed_rank", (torch.randn(b, e), torch.randn(b, s, e)), dict(cu_seqlens=cu), "history"),
        ("packed_width", (torch.randn(b, e), torch.randn(5, e + 3)), dict(cu_seqlens=cu),
         "history"),
        ("cu_seqlens_len", (torch.randn(b, e), torch.randn(5, e)), dict(cu_seqlens=cu[:-1]),
         "cu_seqlens"),
        ("seqlens_len", (torch.randn(b, e), torch.randn(b, s, e)), dict(seqlens=seqlens[:2]),
         "seqlens"),
        ("seqlens_float", (torch.randn(b, e), torch.randn(b, s, e)),
         dict(seqlens=seqlens.float()), "seqlens"),
        ("cu_seqlens_int16", (torch.randn(b, e), torch.randn(5, e)),
         dict(cu_seqlens=cu.short()), "cu_seqlens"),
        ("candidate_dtype", (torch.randn(b, e, dtype=torch.float64), torch.randn(b, s, e)),
         dict(seqlens=seqlens), "candidate dtype"),
        ("history_dtype", (torch.randn(b, e), torch.randn(b, s, e, dtype=torch.bfloat16)),
         dict(seqlens=seqlens), "history dtype"),
    ]


@pytest.mark.parametrize("args,kwargs,match", [pytest.param(a, k, m, id=i)
                                               for i, a, k, m in _bad_inputs()])
def test_bad_forward_inputs_are_value_errors(args, kwargs, match):
    module = TargetAttention(16, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match=match):
        module(*args, **kwargs)


def test_inputs_of_another_dtype_under_autocast():
    """Under autocast the projections choose the dtype: a float32 module takes bfloat16 inputs."""
    module = TargetAttention(16, num_heads=2, backend="torch")
    seqlens = torch.tensor([1, 4, 0], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(3, 16, dtype=torch.bfloat16),
                     torch.randn(3, 4, 16, dtype=torch.bfloat16), seqlens=seqlens)
    assert torch.isfinite(out).all()


# ---- a ranking request: many candidates per user, the history given (and projected) once ----

def _request_reference(module, candidate, offsets, histories):
    """Float64 per-user loop: user u's candidates attend to user u's history rows."""
    h, hk, d = module.num_heads, module.num_kv_heads, module.head_dim
    outs = []
    for u, hist in enumerate(histories):
        cand = candidate[int(offsets[u]):int(offsets[u + 1])].double()
        q = torch.nn.functional.linear(cand, module.q_proj.weight.double(),
                                       module.q_proj.bias.double()).view(-1, h, d)
        kv = torch.nn.functional.linear(hist.double(), module.kv_proj.weight.double(),
                                        module.kv_proj.bias.double()).view(-1, 2, hk, d)
        k, v = (kv[:, i].repeat_interleave(h // hk, dim=1) for i in (0, 1))
        if k.shape[0] == 0:
            att = q.new_zeros(q.shape)
        else:
            w = torch.einsum("qhd,khd->hqk", q, k).mul(d ** -0.5).softmax(-1)
            att = torch.einsum("hqk,khd->qhd", w, v)
        outs.append(torch.nn.functional.linear(att.reshape(-1, h * d),
                                               module.out_proj.weight.double(),
                                               module.out_proj.bias.double()))
    return torch.cat(outs)


def _request(users, e, max_hist, max_cand, dtype=torch.float32, offset_dtype=torch.int32,
             empty=True):
    """A random request: candidate [n, e], candidate_offsets, per-user histories (lists)."""
    low = 0 if empty else 1
    counts = torch.randint(low, max_cand + 1, (users,))
    lens = torch.randint(low, max_hist + 1, (users,))
    if empty and users >= 3:  # a user with no candidates, one with no history, one with neither
        counts[0], lens[1], counts[2], lens[2] = 0, 0, 0, 0
    offsets = torch.nn.functional.pad(counts.cumsum(0), (1, 0)).to(offset_dtype)
    candidate = torch.randn(int(counts.sum()), e, dtype=dtype)
    histories = [torch.randn(int(n), e, dtype=dtype) for n in lens]
    return candidate, offsets, histories, lens


def _history_forms(histories, lens, s, offset_dtype):
    """The same histories padded ([users, s, e] + seqlens, junk past each length), packed
    (rows + cu_seqlens) and nested (layout=torch.jagged)."""
    e, dtype = histories[0].shape[-1], histories[0].dtype
    padded = torch.randn(len(histories), s, e, dtype=dtype) * 1e3  # padding is never read
    for u, hist in enumerate(histories):
        padded[u, :hist.shape[0]] = hist
    packed = torch.cat(histories)
    cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(offset_dtype)
    nested = torch.nested.as_nested_tensor(histories, layout=torch.jagged)  # keeps autograd
    return {"padded": ((padded,), dict(seqlens=lens.to(offset_dtype))),
            "packed": ((packed,), dict(cu_seqlens=cu)),
            "nested": ((nested,), {})}


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("offset_dtype", [torch.int32, torch.int64])
def test_request_matches_reference(form, num_kv_heads, offset_dtype):
    """Forward against the float64 per-user loop: 0 candidates, 0 history, GQA/MQA, int64."""
    torch.manual_seed(10 + num_kv_heads)
    e, max_hist = 32, 40  # histories past 16
    module = TargetAttention(e, num_heads=4, head_dim=8, num_kv_heads=num_kv_heads,
                             max_seqlen_kv=max_hist, backend="torch", dtype=torch.float64)
    candidate, offsets, histories, lens = _request(9, e, max_hist, 7, torch.float64, offset_dtype)
    args, kwargs = _history_forms(histories, lens, max_hist + 3, offset_dtype)[form]
    got = module(candidate, *args, candidate_offsets=offsets, **kwargs)
    want = _request_reference(module, candidate, offsets, histories)
    assert got.shape == (candidate.shape[0], e)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
def test_request_equals_repeated_history_forward_and_backward(form):
    """The request form against today's form with the history repeated per candidate: same
    outputs and the same gradients for candidates, histories and every parameter (fp32)."""
    torch.manual_seed(20)
    e, max_hist = 24, 20
    module = TargetAttention(e, num_heads=2, head_dim=12, num_kv_heads=1,
                             max_seqlen_kv=max_hist)
    candidate, offsets, histories, lens = _request(6, e, max_hist, 5)
    histories = [h.requires_grad_() for h in histories]
    candidate.requires_grad_()
    args, kwargs = _history_forms(histories, lens, max_hist, torch.int64)[form]
    if form == "padded":  # the padded tensor is a new leaf: let its gradient flow to the rows
        padded = torch.zeros(len(histories), max_hist, e)
        for u, hist in enumerate(histories):
            padded = padded.index_put((torch.tensor([u]),), torch.nn.functional.pad(
                hist, (0, 0, 0, max_hist - hist.shape[0])).unsqueeze(0))
        args = (padded,)
    got = module(candidate, *args, candidate_offsets=offsets, **kwargs)
    grad_out = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, [candidate, *histories, *module.parameters()], grad_out,
                                    allow_unused=True)
    # today's form: one (candidate, history) pair per candidate, the history repeated
    counts = (offsets[1:] - offsets[:-1]).tolist()
    repeated = [histories[u] for u in range(len(histories)) for _ in range(counts[u])]
    rep_cu = torch.nn.functional.pad(torch.tensor([r.shape[0] for r in repeated],
                                                  dtype=torch.int64).cumsum(0), (1, 0))
    rep_rows = torch.cat(repeated) if repeated else candidate.new_zeros(0, e)
    want = module(candidate, rep_rows, cu_seqlens=rep_cu)
    want_grads = torch.autograd.grad(want, [candidate, *histories, *module.parameters()],
                                     grad_out, allow_unused=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ref = _request_reference(module, candidate, offsets, histories)
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        if w is None:  # a history of a user without candidates
            assert g is None or not g.any()
            continue
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_padded_nested_packed_give_the_same_request_output():
    torch.manual_seed(30)
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=64)
    candidate, offsets, histories, lens = _request(11, 16, 50, 9, offset_dtype=torch.int64)
    outs = {form: module(candidate, *a, candidate_offsets=offsets, **k)
            for form, (a, k) in _history_forms(histories, lens, 64, torch.int64).items()}
    torch.testing.assert_close(outs["padded"], outs["packed"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs["nested"], outs["packed"], rtol=0, atol=0)
    assert torch.isfinite(outs["packed"]).all()


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
def test_history_is_projected_once_per_user(form):
    """kv_proj sees each user's history rows once (padded: its users x s rows), not once per
    candidate; q_proj sees each candidate once; a nested history's values are not copied."""
    torch.manual_seed(40)
    s = 12
    module = TargetAttention(16, num_heads=4, num_kv_heads=2, max_seqlen_kv=s)
    candidate, offsets, histories, lens = _request(5, 16, s, 30, empty=False)
    args, kwargs = _history_forms(histories, lens, s, torch.int32)[form]
    seen = {"kv": [], "q": []}
    hooks = [module.kv_proj.register_forward_pre_hook(lambda m, a: seen["kv"].append(a[0])),
             module.q_proj.register_forward_pre_hook(lambda m, a: seen["q"].append(a[0]))]
    try:
        module(candidate, *args, candidate_offsets=offsets, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen["kv"]) == 1 and len(seen["q"]) == 1
    rows = {"padded": 5 * s, "packed": int(lens.sum()), "nested": int(lens.sum())}[form]
    assert seen["kv"][0].shape[0] == rows < candidate.shape[0] * s
    assert seen["q"][0].shape[0] == candidate.shape[0]
    if form == "nested":
        assert seen["kv"][0].data_ptr() == args[0].values().data_ptr()


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
def test_history_past_max_seqlen_kv_is_nan_and_counted(form):
    """A user whose history exceeds max_seqlen_kv: its candidates are NaN, the other users'
    outputs are right, and check_errors raises; nothing is truncated silently."""
    import rocm_attn

    rocm_attn.check_errors()  # start clean
    torch.manual_seed(50)
    bound = 8
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=bound, backend="torch")
    candidate, offsets, histories, lens = _request(4, 16, bound, 3, empty=False)
    histories[2] = torch.randn(bound + 3, 16)
    lens[2] = bound + 3
    args, kwargs = _history_forms(histories, lens, bound + 3, torch.int32)[form]
    out = module(candidate, *args, candidate_offsets=offsets, **kwargs)
    bad = torch.zeros(out.shape[0], dtype=torch.bool)
    bad[int(offsets[2]):int(offsets[3])] = True
    assert torch.isnan(out[bad]).all() and bad.any()
    ok = [h if u != 2 else h[:0] for u, h in enumerate(histories)]
    want = _request_reference(module, candidate, offsets, ok)
    torch.testing.assert_close(out[~bad].double(), want[~bad], rtol=1e-4, atol=1e-4)
    with pytest.raises(rocm_attn.SmallSeqContractError, match="max_seqlen_kv"):
        rocm_attn.check_errors()


def test_one_candidate_form_takes_nested_and_int64_histories():
    torch.manual_seed(60)
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=30, dtype=torch.float64)
    b = 7
    candidate = torch.randn(b, 16, dtype=torch.float64)
    lens = torch.randint(0, 31, (b,))
    histories = [torch.randn(int(n), 16, dtype=torch.float64) for n in lens]
    want = _request_reference(module, candidate, torch.arange(b + 1), histories)
    forms = _history_forms(histories, lens, 30, torch.int64)
    for form, (args, kwargs) in forms.items():
        got = module(candidate, *args, **kwargs)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=form)


def test_request_with_no_candidates_and_no_users():
    module = TargetAttention(16, num_heads=2)
    out = module(torch.randn(0, 16), torch.randn(3, 4, 16), seqlens=torch.tensor([1, 2, 3]),
                 candidate_offsets=torch.zeros(4, dtype=torch.int64))
    assert out.shape == (0, 16)
    out = module(torch.randn(0, 16), torch.randn(0, 16),
                 cu_seqlens=torch.zeros(1, dtype=torch.int32),
                 candidate_offsets=torch.zeros(1, dtype=torch.int32))
    assert out.shape == (0, 16)


def _bad_request_inputs():
    e = 16
    cand, hist = torch.randn(6, e), torch.randn(3, 4, e)
    seqlens = torch.tensor([1, 4, 0], dtype=torch.int32)
    offs = torch.tensor([0, 2, 2, 6], dtype=torch.int32)
    nested = torch.nested.nested_tensor([torch.randn(2, e), torch.randn(1, e)],
                                        layout=torch.jagged)
    strided_nested = torch.nested.nested_tensor([torch.randn(2, e), torch.randn(1, e)])
    return [
        ("offsets_len", (cand, hist), dict(seqlens=seqlens, candidate_offsets=offs[:-1]),
         "candidate_offsets"),
        ("offsets_float", (cand, hist), dict(seqlens=seqlens, candidate_offsets=offs.float()),
         "candidate_offsets"),
        ("offsets_2d", (cand, hist), dict(seqlens=seqlens, candidate_offsets=offs.view(1, 4)),
         "candidate_offsets"),
        ("offsets_strided", (cand, hist),
         dict(seqlens=seqlens, candidate_offsets=torch.zeros(8, dtype=torch.int32)[::2]),
         "candidate_offsets"),
        ("max_candidates_alone", (cand[:3], hist), dict(seqlens=seqlens, max_candidates=4),
         "max_candidates"),
        ("max_candidates_zero", (cand, hist),
         dict(seqlens=seqlens, candidate_offsets=offs, max_candidates=0), "max_candidates"),
        ("nested_with_seqlens", (cand[:2], nested), dict(seqlens=seqlens[:2]), "nested"),
        ("nested_strided", (cand[:2], strided_nested), {}, "jagged"),
        ("nested_users", (cand[:3], nested), {}, "users"),
        ("nested_candidate", (torch.nested.nested_tensor([cand], layout=torch.jagged), hist),
         dict(seqlens=seqlens), "candidate"),
        ("one_per_user_count", (cand, hist), dict(seqlens=seqlens), "candidate_offsets"),
    ]


@pytest.mark.parametrize("args,kwargs,match", [pytest.param(a, k, m, id=i)
                                               for i, a, k, m in _bad_request_inputs()])
def test_bad_request_inputs_are_value_errors(args, kwargs, match):
    module = TargetAttention(16, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match=match):
        module(*args, **kwargs)


@pytest.mark.parametrize("counts", [[0, 1, 0], [1, 1, 1], [0, 0, 1]])
def test_request_with_at_most_one_candidate_per_user(counts):
    """A request whose users have 0 or 1 candidates (max_candidates 1 too) is still a request."""
    torch.manual_seed(80)
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=8, dtype=torch.float64)
    offsets = torch.nn.functional.pad(torch.tensor(counts).cumsum(0), (1, 0))
    candidate = torch.randn(sum(counts), 16, dtype=torch.float64)
    histories = [torch.randn(n, 16, dtype=torch.float64) for n in (3, 0, 8)]
    lens = torch.tensor([3, 0, 8])
    want = _request_reference(module, candidate, offsets, histories)
    for form, (args, kwargs) in _history_forms(histories, lens, 8, torch.int32).items():
        for bound in (None, 1):
            got = module(candidate, *args, candidate_offsets=offsets, max_candidates=bound,
                         **kwargs)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=form)


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
def test_request_under_torch_compile_fullgraph(form):
    torch.manual_seed(90)
    module = TargetAttention(16, num_heads=2, num_kv_heads=1, max_seqlen_kv=24)
    candidate, offsets, histories, lens = _request(5, 16, 24, 6, offset_dtype=torch.int64)
    args, kwargs = _history_forms(histories, lens, 24, torch.int64)[form]
    want = module(candidate, *args, candidate_offsets=offsets, **kwargs)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    got = compiled(candidate, *args, candidate_offsets=offsets, max_candidates=6, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_request_kernel_path_matches_reference_on_gpu(num_kv_heads):
    """A request on the GPU (bf16, head dim 64, histories past 16, int64 offsets): forward and
    gradients against the float64 per-user loop."""
    import rocm_attn._ext as ext

    if not (torch.cuda.is_available() and ext.HAS_EXTENSION):
        pytest.skip("needs a GPU and the compiled extension")
    torch.manual_seed(100)
    e, max_hist = 256, 200
    module = TargetAttention(e, num_heads=4, head_dim=64, num_kv_heads=num_kv_heads,
                             max_seqlen_kv=max_hist, device="cuda", dtype=torch.bfloat16)
    candidate, offsets, histories, lens = _request(33, e, max_hist, 40, torch.bfloat16,
                                                   torch.int64)
    candidate = candidate.cuda().requires_grad_()
    histories = [h.cuda() for h in histories]
    args, kwargs = _history_forms(histories, lens.cuda(), max_hist, torch.int64)["packed"]
    args = (args[0].requires_grad_(),)
    got = module(candidate, *args, candidate_offsets=offsets.cuda(), max_candidates=40,
                 **kwargs)
    ref_module = TargetAttention(e, num_heads=4, head_dim=64, num_kv_heads=num_kv_heads,
                                 max_seqlen_kv=max_hist, dtype=torch.float64)
    ref_module.load_state_dict({k: v.double().cpu() for k, v in module.state_dict().items()})
    ref_candidate = candidate.detach().double().cpu().requires_grad_()
    ref_rows = args[0].detach().double().cpu().requires_grad_()
    ref_hist = list(torch.split(ref_rows, lens.tolist()))
    want = _request_reference(ref_module, ref_candidate, offsets, ref_hist)
    err = ((got.double().cpu() - want).norm() / want.norm()).item()
    assert err < 2e-2, err
    grad = torch.randn_like(want)
    got.backward(grad.to(got.device, got.dtype))
    want.backward(grad)
    for g, w in ((candidate.grad, ref_candidate.grad), (args[0].grad, ref_rows.grad)):
        assert torch.isfinite(g).all()
        rel = ((g.double().cpu() - w).norm() / w.norm()).item()
        assert rel < 3e-2, rel


def test_user_past_max_candidates_is_nan_and_counted():
    import rocm_attn

    rocm_attn.check_errors()
    torch.manual_seed(110)
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=8)
    offsets = torch.tensor([0, 2, 7, 8])  # user 1 has 5 candidates > max_candidates=4
    candidate = torch.randn(8, 16)
    histories = [torch.randn(n, 16) for n in (3, 5, 8)]
    args, kwargs = _history_forms(histories, torch.tensor([3, 5, 8]), 8, torch.int64)["nested"]
    out = module(candidate, *args, candidate_offsets=offsets, max_candidates=4, **kwargs)
    assert torch.isnan(out[2:6]).all() and torch.isfinite(out[[0, 1, 7]]).all()
    want = _request_reference(module, candidate, offsets, histories)
    torch.testing.assert_close(out[[0, 1, 7]].double(), want[[0, 1, 7]], rtol=1e-4, atol=1e-4)
    with pytest.raises(rocm_attn.SmallSeqContractError):
        rocm_attn.check_errors()


# Bounds that never give NaN silently, and candidate rows outside every user.


def _clean_counter():
    import rocm_attn

    rocm_attn.errors.read_errors(reset=True)


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
@pytest.mark.parametrize("request_form", [False, True], ids=["one-candidate", "request"])
def test_default_module_takes_bounds_from_the_data(form, request_form):
    """TargetAttention(embed_dim, num_heads) with histories past 16 items (the old default
    bound): every output finite and right, nothing counted."""
    import rocm_attn

    _clean_counter()
    torch.manual_seed(80)
    module = TargetAttention(16, num_heads=2, dtype=torch.float64)
    assert module.max_seqlen_kv is None and module.max_candidates is None
    users = 5
    if request_form:
        candidate, offsets, histories, lens = _request(users, 16, 40, 6, dtype=torch.float64)
        kw = dict(candidate_offsets=offsets)
    else:
        candidate = torch.randn(users, 16, dtype=torch.float64)
        offsets = torch.arange(users + 1)
        lens = torch.tensor([17, 40, 0, 23, 5])
        histories = [torch.randn(int(n), 16, dtype=torch.float64) for n in lens]
        kw = {}
    lens[-1] = 33  # past 16 in every case
    histories[-1] = torch.randn(33, 16, dtype=torch.float64)
    args, hist_kw = _history_forms(histories, lens, 40, torch.int32)[form]
    out = module(candidate, *args, **hist_kw, **kw)
    assert torch.isfinite(out).all()
    want = _request_reference(module, candidate, offsets, histories)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    rocm_attn.check_errors()


def test_derived_bounds_are_logged_at_debug(caplog):
    import logging

    torch.manual_seed(81)
    module = TargetAttention(16, num_heads=2)
    candidate, offsets, histories, lens = _request(4, 16, 20, 5)
    args, kw = _history_forms(histories, lens, 20, torch.int32)["packed"]
    with caplog.at_level(logging.DEBUG, logger="rocm_attn"):
        module(candidate, *args, **kw, candidate_offsets=offsets)
    want = f"max_seqlen_kv={max(int(lens.max()), 1)}, max_candidates={int(offsets.diff().max())}"
    assert "one host read" in caplog.text and want in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="rocm_attn"):
        module(candidate, *args, **kw, candidate_offsets=offsets, max_seqlen_kv=20,
               max_candidates=5)
    assert "host read" not in caplog.text


def test_forward_bounds_override_the_constructor():
    """max_seqlen_kv= and max_candidates= per call (as FBGEMM passes max_L per call); the
    constructor's values are defaults."""
    import rocm_attn

    _clean_counter()
    torch.manual_seed(82)
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=4, max_candidates=2,
                             dtype=torch.float64)
    candidate, offsets, histories, lens = _request(4, 16, 30, 6, dtype=torch.float64,
                                                   empty=False)
    lens[0] = 30
    histories[0] = torch.randn(30, 16, dtype=torch.float64)
    args, kw = _history_forms(histories, lens, 30, torch.int32)["packed"]
    want = _request_reference(module, candidate, offsets, histories)
    out = module(candidate, *args, **kw, candidate_offsets=offsets, max_seqlen_kv=30,
                 max_candidates=6)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    rocm_attn.check_errors()
    # the constructor's tighter bounds: the users past them are NaN and counted
    out = module(candidate, *args, **kw, candidate_offsets=offsets)
    assert torch.isnan(out[:int(offsets[1])]).all()
    with pytest.raises(rocm_attn.SmallSeqContractError):
        rocm_attn.check_errors()
    for name in ("max_seqlen_kv", "max_candidates"):
        with pytest.raises(ValueError, match=name):
            module(candidate, *args, **kw, candidate_offsets=offsets, **{name: 0})
    with pytest.raises(ValueError, match="max_candidates"):
        TargetAttention(16, num_heads=2, max_candidates=0)


@pytest.mark.parametrize("form", ["padded", "packed", "nested"])
def test_validate_raises_at_the_call_for_every_history_form(form, monkeypatch):
    """ROCM_ATTN_VALIDATE=1: a request whose history is past max_seqlen_kv raises at the call
    for every history form (a padded history is flagged by the module, after the op)."""
    import rocm_attn

    _clean_counter()
    torch.manual_seed(83)
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=8)
    candidate, offsets, histories, lens = _request(4, 16, 8, 3, empty=False)
    histories[1], lens[1] = torch.randn(11, 16), 11
    args, kw = _history_forms(histories, lens, 11, torch.int32)[form]
    monkeypatch.setenv("ROCM_ATTN_VALIDATE", "1")
    with pytest.raises(rocm_attn.SmallSeqContractError):
        module(candidate, *args, **kw, candidate_offsets=offsets)
    rocm_attn.check_errors()  # raised for, not left behind


@pytest.mark.parametrize("where", ["tail", "head"])
def test_candidates_outside_every_user_are_nan_and_counted(where):
    """candidate_offsets that leave rows outside every user: with the bounds given (no read)
    those rows are NaN and counted, never out_proj.bias; with the bounds from the data the
    call raises ValueError naming candidate_offsets."""
    import rocm_attn

    _clean_counter()
    torch.manual_seed(84)
    module = TargetAttention(16, num_heads=2)
    candidate, offsets, histories, lens = _request(3, 16, 6, 4, empty=False)
    n = candidate.shape[0]
    extra = torch.randn(2, 16)
    if where == "tail":
        candidate = torch.cat([candidate, extra])
        outside = torch.arange(n, n + 2)
    else:
        candidate = torch.cat([extra, candidate])
        offsets = offsets + 2
        outside = torch.arange(2)
    args, kw = _history_forms(histories, lens, 6, torch.int32)["packed"]
    out = module(candidate, *args, **kw, candidate_offsets=offsets, max_seqlen_kv=6,
                 max_candidates=4)
    inside = torch.ones(out.shape[0], dtype=torch.bool)
    inside[outside] = False
    assert torch.isnan(out[outside]).all()
    assert torch.isfinite(out[inside]).all()
    with pytest.raises(rocm_attn.SmallSeqContractError, match="1 segment"):
        rocm_attn.check_errors()
    with pytest.raises(ValueError, match="candidate_offsets"):
        module(candidate, *args, **kw, candidate_offsets=offsets)


def _traced_error(message: str) -> str:
    """The message a traced call's ValueError shows: torch 2.4's dynamo reports an exception
    raised under tracing as "Observed exception" without its text."""
    old = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5)
    return "Observed exception" if old else message


def test_compile_without_a_bound_raises_and_with_one_works():
    """torch.compile cannot read offsets: a missing bound is a ValueError naming it; a padded
    history's bound is its width (no read), and given bounds compile fullgraph."""
    torch.manual_seed(85)
    module = TargetAttention(16, num_heads=2)
    candidate, offsets, histories, lens = _request(3, 16, 6, 4, empty=False)
    packed, kw = _history_forms(histories, lens, 6, torch.int32)["packed"]

    def call(c, h, cu, off, **bounds):
        return module(c, h, cu_seqlens=cu, candidate_offsets=off, **bounds)

    torch._dynamo.reset()
    message = _traced_error("max_seqlen_kv and max_candidates must be given")
    with pytest.raises(Exception, match=message):
        torch.compile(call, fullgraph=True)(candidate, packed[0], kw["cu_seqlens"], offsets)
    got = torch.compile(call, fullgraph=True)(candidate, packed[0], kw["cu_seqlens"], offsets,
                                              max_seqlen_kv=6, max_candidates=4)
    torch.testing.assert_close(got, call(candidate, packed[0], kw["cu_seqlens"], offsets))
    b = 3
    hist = torch.randn(b, 7, 16)
    lens_p = torch.tensor([7, 0, 3], dtype=torch.int32)
    one = torch.compile(lambda c, h, s: module(c, h, seqlens=s), fullgraph=True)
    torch.testing.assert_close(one(candidate[:b], hist, lens_p),
                               module(candidate[:b], hist, seqlens=lens_p))


def test_export_without_max_candidates_raises():
    module = TargetAttention(16, num_heads=2, max_seqlen_kv=6)

    class Req(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.att = module

        def forward(self, c, h, cu, off):
            return self.att(c, h, cu_seqlens=cu, candidate_offsets=off)

    candidate, offsets, histories, lens = _request(3, 16, 6, 4, empty=False)
    args, kw = _history_forms(histories, lens, 6, torch.int32)["packed"]
    with pytest.raises(Exception, match=_traced_error("max_candidates must be given")):
        torch.export.export(Req(), (candidate, args[0], kw["cu_seqlens"], offsets))
