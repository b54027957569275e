"""The p2p ring's communication schedule, recorded in one process (no process group): which
exchanges each rank posts and waits for, in which direction, and where the attention steps
fall between them. Correctness of the results is the gloo / NCCL suites' job (test_cp.py)."""

from __future__ import annotations

import pytest
import torch

from rocm_attn.cp import api, comm, p2p
from helpers.cp import FakeGroup, cu_of  # noqa: E402

F64 = torch.float64


class _Recorder:
    """Stands in for comm.RingExchange: logs ("post"/"wait", tag, reverse) and returns a
    tensor of the right shape (the data does not matter for the schedule)."""

    def __init__(self, log):
        self.log = log

    def __call__(self, send, group=None, cp=None, rank=None, tag=None, reverse=False):
        log = self.log
        log.append(("post", tag, reverse))

        class _Pending:
            def wait(self_inner):
                log.append(("wait", tag, reverse))
                return torch.randn_like(send)

        return _Pending()


def _schedule(cp: int, rank: int, save_kv: bool, monkeypatch):
    lens = [4 * cp, 6 * cp]
    cu = cu_of(lens)
    t = sum(lens) // cp
    q, k, v = (torch.randn(t, 2, 8, dtype=F64) for _ in range(3))
    plan = api._make_plan(q, k, v, cu, cu, max(lens), max(lens), FakeGroup(cp, rank), "p2p",
                          "causal", (-1, -1), None, None, None, None, "reference", True, False)
    log = []
    monkeypatch.setenv("ROCM_ATTN_CP_SAVE_RING_KV", "1")  # the forward keeps its last kv
    monkeypatch.setattr(comm, "RingExchange", _Recorder(log))
    step_fn = p2p.backward_step

    def traced_step(dq, plan_, dout, dlse, q_, kv, out, lse, step, **kw):
        log.append(("compute", step))
        return step_fn(dq, plan_, dout, dlse, q_, kv, out, lse, step, **kw)

    monkeypatch.setattr(p2p, "backward_step", traced_step)
    out, lse, _max_logit, last_kv = p2p.ring_forward(q, k, v, plan)
    fwd = list(log)
    log.clear()
    p2p.ring_backward(torch.randn_like(out), None, q, k, v, out, lse, plan,
                      last_kv if save_kv else None)
    return fwd, log


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
@pytest.mark.parametrize("save_kv", [True, False])
def test_backward_ring_runs_in_reverse_and_ends_with_compute(cp, save_kv, monkeypatch):
    fwd, bwd = _schedule(cp, cp - 1, save_kv, monkeypatch)
    kv, dkv = comm.TAG_KV, comm.TAG_DKV
    # forward: cp - 1 kv exchanges in ring order
    assert [e for e in fwd if e[0] == "post"] == [("post", kv, False)] * (cp - 1)
    # backward: forward steps in reverse order, the rank's own kv (step 0) last
    assert [e[1] for e in bwd if e[0] == "compute"] == list(range(cp - 1, -1, -1))
    posts = [e for e in bwd if e[0] == "post"]
    fetch = 0 if save_kv else 1  # without the saved kv, one fetch before any compute
    assert posts.count(("post", kv, True)) == (cp - 2) + fetch
    assert posts.count(("post", dkv, True)) == cp - 1
    assert all(reverse for _, _, reverse in posts)
    # with the saved kv nothing is waited for before the first step (its next kv is only posted)
    first_compute = bwd.index(("compute", cp - 1))
    assert [e for e in bwd[:first_compute] if e[0] == "wait"] == [("wait", kv, True)] * fetch
    # nothing is sent after the last step's compute: the gradients are finished there
    last_compute = bwd.index(("compute", 0))
    assert not [e for e in bwd[last_compute:] if e[0] == "post"]
    # every posted exchange is waited for
    assert sum(e[0] == "wait" for e in bwd) == len(posts)
