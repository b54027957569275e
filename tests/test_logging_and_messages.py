"""Logging says which backend serves a call (once at INFO, silent by default); error messages
carry the fix."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rocm_attn
from rocm_attn import _ext, _logging, thd
from rocm_attn.small_seq import fused_attn_small_seq

ROOT = Path(__file__).resolve().parent.parent

def _run(args: list, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != _logging.ENV_VAR}
    full_env.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def _three_calls():
    q, k = torch.randn(3, 2, 64), torch.randn(5, 2, 64)
    cu_q = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    cu_kv = torch.tensor([0, 1, 3, 5], dtype=torch.int32)
    for _ in range(3):
        fused_attn_small_seq(q, k, k, cu_q, cu_kv)


@pytest.mark.skipif(bool(os.environ.get(_logging.ENV_VAR)), reason="log level set by the env")
def test_silent_by_default(caplog):
    caplog.set_level(logging.WARNING)
    _three_calls()
    assert not caplog.records  # nothing at Python's default level
    assert not logging.getLogger("rocm_attn").handlers  # and no handler of our own


def test_env_level_shows_the_backend_report():
    # also proves the `python3 -m rocm_attn` entry point
    proc = _run(["-m", "rocm_attn", "info"], ROCM_ATTN_LOG_LEVEL="INFO")
    assert proc.returncode == 0, proc.stderr
    assert "backends on this device" in proc.stdout
    reason = "no compiled kernels" if not _ext.HAS_EXTENSION else "compiled kernels loaded"
    assert f"[rocm_attn INFO] {reason}" in proc.stderr, proc.stderr


def test_info_once_then_debug_every_call(caplog):
    _logging._seen.clear()
    logging.getLogger("rocm_attn").propagate = True  # the CLI's --log-level may have turned it off
    caplog.set_level(logging.DEBUG, logger="rocm_attn")
    _three_calls()
    hits = [r.levelno for r in caplog.records
            if "fused_attn_small_seq: torch path" in r.getMessage()]
    assert hits == [logging.INFO, logging.DEBUG, logging.DEBUG]


def test_bad_env_level_warns_and_is_ignored(monkeypatch):
    monkeypatch.setenv(_logging.ENV_VAR, "loud")
    with pytest.warns(UserWarning, match="ROCM_ATTN_LOG_LEVEL='loud' ignored.*DEBUG"):
        _logging.configure_from_env()


def test_set_level_rejects_unknown_names():
    with pytest.raises(ValueError, match="DEBUG"):
        _logging.set_level("chatty")


@pytest.mark.skipif(_ext.HAS_EXTENSION, reason="message for installs without the extension")
def test_extension_missing_message_says_how_to_build():
    msg = _ext.extension_error()
    assert "pip install --no-build-isolation" in msg and "torch path" in msg


def test_unsupported_head_dim_names_supported_ones_and_the_fix():
    q = torch.randn(2, 1, 96, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError) as err:
        fused_attn_small_seq(q, q, q, cu, cu, backend="kernel")
    msg = str(err.value)
    assert "head dim 96 (kernels: 64, 128, 256, 512)" in msg and "backend='torch'" in msg


def test_long_history_is_served_not_refused():
    """A history past 16 keys is a valid call (the tiled kernels, the varlen attention or the
    torch path serve it), never an error."""
    q = torch.randn(2, 1, 64)
    k = torch.randn(50, 1, 64)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_kv = torch.tensor([0, 32, 50], dtype=torch.int32)
    out = fused_attn_small_seq(q, k, k, cu_q, cu_kv, max_seqlen_kv=32)
    assert torch.isfinite(out).all()


def test_thd_kernel_backend_message_has_the_fix():
    x = torch.randn(8, 2, 4)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="tensors on cpu.*backend='torch'"):
        thd.partition(x, cu, 2, 0, backend="kernel")


def test_contract_error_message_has_the_fix():
    rocm_attn.errors.read_errors(reset=True)  # start from a clean counter
    q = torch.randn(2, 1, 64)
    k = torch.randn(40, 1, 64)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_kv = torch.tensor([0, 20, 40], dtype=torch.int32)  # 20 keys > max_seqlen_kv
    fused_attn_small_seq(q, k, k, cu_q, cu_kv, max_seqlen_kv=16)
    with pytest.raises(rocm_attn.SmallSeqContractError,
                       match="raise max_seqlen_q / max_seqlen_kv.*validate='sync'"):
        rocm_attn.check_errors()
