"""The torch_flash start-up check: before any step runs, attn_with_cp / attention find out
whether this torch's flash attention does varlen, windows and GQA (old ROCm builds lack them,
or take the arguments and compute something else), and fall back to the reference backend
with a logged reason instead of failing mid-step. The aten ops are replaced by
tests/helpers/flash_emulator.py (correct) and by broken stand-ins, so this runs on the CPU."""

from __future__ import annotations

import logging

from helpers import flash_emulator
import pytest
import torch

from rocm_attn.varlen import backends
from rocm_attn.varlen.backends import flash_support_problem, resolve_backend

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_check(monkeypatch):
    """An empty answer cache, restored afterwards; schema taken as complete (the emulator
    stands in for the ops, whatever the installed torch's schema says)."""
    monkeypatch.setattr(backends, "_SUPPORT", {})
    monkeypatch.setattr(backends, "_schema_problem", lambda: None)


def _use(monkeypatch, fwd=flash_emulator.flash_forward, bwd=flash_emulator.flash_backward):
    monkeypatch.setattr(backends, "_aten_flash", lambda: (fwd, bwd))


def _no_window_forward(*args, **kw):
    """A flash that takes the window arguments and ignores them."""
    kw.update(window_size_left=None, window_size_right=None)
    return flash_emulator.flash_forward(*args, **kw)


def _no_varlen_forward(*args, **kw):
    raise RuntimeError("flash_attn: varlen (cum_seq_q) is not supported on this build\nmore")


def _no_gqa_forward(q, k, v, *args, **kw):
    if q.shape[1] != k.shape[1]:
        raise RuntimeError("Number of heads in key/value must equal the query's")
    return flash_emulator.flash_forward(q, k, v, *args, **kw)


def test_working_flash_passes(monkeypatch):
    _use(monkeypatch)
    assert flash_support_problem(CPU, torch.float64) is None


def test_the_first_check_may_run_under_inference_mode(monkeypatch):
    """The first call of a process may come under torch.inference_mode: the check's float64
    reference still takes its gradients, and the answer is the same as outside it."""
    _use(monkeypatch)
    with torch.inference_mode():
        assert flash_support_problem(CPU, torch.float64) is None
    monkeypatch.setattr(backends, "_SUPPORT", {})
    _use(monkeypatch, fwd=_no_window_forward)
    with torch.inference_mode():
        assert "wrong out" in flash_support_problem(CPU, torch.float64)


@pytest.mark.parametrize("fwd, words", [
    (_no_window_forward, "wrong out"),
    (_no_varlen_forward, "RuntimeError: flash_attn: varlen (cum_seq_q) is not supported"),
    (_no_gqa_forward, "Number of heads"),
])
def test_broken_flash_is_found_once_and_logged(monkeypatch, caplog, fwd, words):
    calls = []

    def counted(*args, **kw):
        calls.append(1)
        return fwd(*args, **kw)

    _use(monkeypatch, fwd=counted)
    with caplog.at_level(logging.WARNING, logger="rocm_attn.cp"):
        why = flash_support_problem(CPU, torch.float64)
        assert flash_support_problem(CPU, torch.float64) == why  # answered from the cache
    assert why is not None and words in why and "\n" not in why, why
    assert len(calls) == 1
    assert "torch_flash is unusable" in caplog.text and words in caplog.text


def test_broken_backward_is_found(monkeypatch):
    def bwd(*args, **kw):
        raise RuntimeError("backward: window_size_left is not supported")

    _use(monkeypatch, bwd=bwd)
    assert "backward: window_size_left" in flash_support_problem(CPU, torch.float64)


def test_schema_without_window_arguments(monkeypatch):
    """A torch whose aten op has no window arguments is refused from the schema alone."""
    monkeypatch.undo()  # the real _schema_problem
    monkeypatch.setattr(backends, "_SUPPORT", {})
    monkeypatch.setitem(backends._NEEDED_ARGS, "forward",
                        backends._NEEDED_ARGS["forward"] + ("window_size_middle",))
    why = flash_support_problem(CPU, torch.float64)
    assert "has no window_size_middle argument" in why


def test_auto_falls_back_and_explicit_refuses_before_any_step(monkeypatch, caplog):
    """resolve_backend runs once per call, before the first step: auto -> reference with the
    reason logged; backend='torch_flash' -> ValueError naming the reason."""
    _use(monkeypatch, fwd=_no_varlen_forward)
    monkeypatch.setattr(backends, "_input_problem", lambda q: None)  # as if on a GPU
    q = torch.randn(5, 4, 64, dtype=torch.float64)
    with caplog.at_level(logging.INFO, logger="rocm_attn.cp"):
        assert resolve_backend("auto", q).name == "reference"
    assert "auto -> reference" in caplog.text and "varlen (cum_seq_q)" in caplog.text
    with pytest.raises(ValueError, match="torch_flash' cannot serve.*varlen"):
        resolve_backend("torch_flash", q)


def test_attention_runs_on_reference_when_flash_is_broken(monkeypatch):
    """The whole call on a torch whose flash is broken: same result as backend='reference'."""
    from rocm_attn import attention

    _use(monkeypatch, fwd=_no_window_forward)
    monkeypatch.setattr(backends, "_input_problem", lambda q: None)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(9, h, 64, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    kw = dict(attn_mask_type="causal_bottom_right", window_size=(2, 0))
    got = attention(q, k, v, cu, cu, 5, 5, backend="auto", **kw)
    want = attention(q, k, v, cu, cu, 5, 5, backend="reference", **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_no_probe_while_compiling(monkeypatch):
    _use(monkeypatch, fwd=_no_varlen_forward)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert flash_support_problem(CPU, torch.float64) is None
    assert backends._SUPPORT == {}  # nothing cached: the next eager call probes
