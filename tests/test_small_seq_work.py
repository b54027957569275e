"""The CPU torch path's time and memory follow the rows and (query, key) pairs that exist, not
segments x bound: a generous max_seqlen_q / max_seqlen_kv (a server's max_candidates=8192, a
module that once took every user's bound from the total row count) or ragged counts cost about
what tight bounds cost (rocm_attn/small_seq_torch.py, _cpu_grouped and _tight_bounds).

Memory is measured (peak RSS of a fresh process, against the same request with tight bounds);
time is left to the benchmark rows of ``rocm-attn bench small-seq --device cpu`` (not a timed
test on a shared machine). Results of the grouped form against the float64 oracle, with
gradients, ragged and skewed counts, empty segments and bad ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocm_attn import small_seq_torch  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
import test_small_seq  # noqa: E402
from test_small_seq import Rng  # noqa: E402
from test_small_seq_segments import Call, check  # noqa: E402

_error_counter = test_small_seq._error_counter
allow_contract_errors = test_small_seq.allow_contract_errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PEAK = r"""
import json, resource, sys, torch
import rocm_attn
users, cands, hist, max_q, max_kv, grad = (int(x) for x in sys.argv[1:7])
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
cnt = torch.full((users,), cands)
lens = torch.randint(1, hist + 1, (users,), generator=g)
cu_q = torch.nn.functional.pad(cnt.cumsum(0), (1, 0))
cu_kv = torch.nn.functional.pad(lens.cumsum(0), (1, 0))
q = torch.randn(int(cnt.sum()), 2, 16, generator=g).requires_grad_(bool(grad))
k = torch.randn(int(lens.sum()), 2, 16, generator=g).requires_grad_(bool(grad))
v = torch.randn(int(lens.sum()), 2, 16, generator=g).requires_grad_(bool(grad))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = rocm_attn.fused_attn_small_seq(q, k, v, cu_q, cu_kv, max_q, max_kv)
if grad:
    out.sum().backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"kib": peak - base, "finite": bool(torch.isfinite(out).all())}))
"""


def _peak_kib(*args) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", _PEAK, *(str(a) for a in args)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("grad", [0, 1], ids=["infer", "train"])
@pytest.mark.parametrize("users,cands,hist,loose_q,loose_kv", [
    pytest.param(1000, 1, 20, 1000, 20, id="1000x1-max_q=rows"),
    pytest.param(8, 64, 40, 8192, 40, id="8x64-max_q=8192"),
    pytest.param(500, 2, 12, 2, 4096, id="500x2-max_kv=4096"),
])
def test_memory_follows_the_data_not_the_bound(users, cands, hist, loose_q, loose_kv, grad):
    """Peak memory of a call with a generous bound within 1.5x (+8 MiB) of the same call with
    tight bounds. With segments x bound padding the loose calls take 10-100x."""
    tight = _peak_kib(users, cands, hist, max(cands, 2), hist, grad)
    loose = _peak_kib(users, cands, hist, loose_q, loose_kv, grad)
    assert tight["finite"] and loose["finite"]
    assert loose["kib"] <= 1.5 * tight["kib"] + 8 * 1024, (loose, tight)


def test_grouped_form_pads_each_group_to_its_own_counts(monkeypatch):
    """The gathered query and key slots of a skewed request (one user with 300 candidates and
    200 keys, 400 with 1 and 1..8) stay within 4x the rows, though segments x largest count
    is 100x that."""
    seen = {"q": 0, "kv": 0}
    gather = small_seq_torch._gather_rows

    def counting(x, rows):
        seen["q" if x.shape[0] == total_q else "kv"] += rows.numel()
        return gather(x, rows)

    monkeypatch.setattr(small_seq_torch, "_gather_rows", counting)
    rng = Rng(0, "skew")
    g = torch.Generator().manual_seed(1)
    nq = [300] + [1] * 400
    nkv = [200] + torch.randint(1, 9, (400,), generator=g).tolist()
    call = Call(rng, nq, nkv, 2, 1, 16, torch.float32, max_q=4096, max_kv=4096, q_tail=1)
    total_q = call.total_q
    if call.total_kv == total_q:  # the counter tells q from k by rows
        pytest.skip("q and k have as many rows")
    check(call, grads=True)
    assert 0 < seen["q"] <= 4 * total_q, seen
    assert 0 < seen["kv"] <= 2 * 4 * call.total_kv, seen


@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_and_loose_bounds_match_the_oracle(grads, seed):
    """Skewed counts with empty segments (no queries, no keys, neither), loose bounds, GQA:
    out, lse and gradients against the float64 oracle."""
    g = torch.Generator().manual_seed(seed)
    users = 60
    nq = torch.randint(0, 4, (users,), generator=g)
    nq[::17] = torch.randint(20, 70, (nq[::17].numel(),), generator=g)
    nkv = torch.randint(0, 30, (users,), generator=g)
    nkv[::13] = 0
    call = Call(Rng(seed, "ragged_loose"), nq.tolist(), nkv.tolist(), 4, 2, 16,
                torch.float32, max_q=5000, max_kv=700, q_lead=3, q_tail=2)
    check(call, grads)


def test_grouped_and_tight_forms_agree(monkeypatch):
    """The same call through the grouped form and through the padded batch at the data's own
    counts (what tight bounds take): equal up to float32 rounding, forward and backward."""
    call = Call(Rng(3, "agree"), [3, 1, 2, 3, 3], [5, 7, 1, 7, 6], 4, 2, 16, torch.float32,
                max_q=3, max_kv=7)
    a = call.run(True)
    monkeypatch.setattr(small_seq_torch, "_tight_bounds", lambda seg: None)
    b = call.run(True)
    for x, y in zip((a[0], a[1], *a[2]), (b[0], b[1], *b[2])):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_nan_key_stays_in_its_segment_in_the_grouped_form():
    call = Call(Rng(4, "nan_iso"), [2, 40, 1, 1], [3, 5, 9, 2], 2, 2, 16, torch.float32,
                max_q=4096, max_kv=64)
    call.k[3] = float("nan")  # segment 1's first key
    out, _, g = call.run(True)
    rows = call.cu_q.tolist()
    assert torch.isnan(out[rows[1]:rows[2]]).all()
    keep = torch.ones(call.total_q, dtype=torch.bool)
    keep[rows[1]:rows[2]] = False
    assert torch.isfinite(out[keep]).all() and torch.isfinite(g[0][keep]).all()
    assert read_errors(reset=True) == (0, -1)
