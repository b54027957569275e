"""rocm_attn.tuning: the launch tuning values of hip_src/common/tuning.h, read once from the
environment at load and overridden in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rocm_attn
from rocm_attn import _ext

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "hip_src" / "common" / "tuning.h"
KNOB_ROW = re.compile(r'\{"(\w+)", "(ROCM_ATTN_\w+)", &RaTuning::(\w+)\}')
gpu = pytest.mark.gpu
needs_kernels = pytest.mark.skipif(not (_ext.HAS_EXTENSION and torch.cuda.is_available()),
                                   reason="no CUDA/ROCm GPU or no compiled extension")


def header_knobs():
    return {name: env for name, env, field in KNOB_ROW.findall(HEADER.read_text())}


def test_header_table_is_complete_and_documented():
    """Every field of RaTuning has one row in kRaTuningKnobs, named after it, and the README
    lists each row's environment variable (the one table of switches)."""
    text = HEADER.read_text()
    fields = re.findall(r"^\s+int (\w+) = -?\d+;", text, re.M)
    rows = KNOB_ROW.findall(text)
    assert fields and sorted(fields) == sorted(field for _, _, field in rows)
    assert all(name == field for name, _, field in rows)
    readme = (ROOT / "README.md").read_text()
    missing = [env for env in header_knobs().values() if env not in readme]
    assert not missing, f"README's switch table lacks {missing}"


def test_launchers_read_no_environment():
    """Launch paths read ra_tuning(), never getenv: only tuning.hip reads the environment."""
    readers = [str(p.relative_to(ROOT)) for p in (ROOT / "hip_src").rglob("*")
               if p.suffix in (".h", ".hip", ".cpp") and "getenv(" in p.read_text()]
    assert readers == ["hip_src/common/tuning.hip"]


@pytest.mark.skipif(_ext.HAS_EXTENSION, reason="the compiled extension is loaded")
def test_without_kernels_nothing_to_tune():
    assert rocm_attn.tuning.values() == {}
    with pytest.raises(RuntimeError, match="needs the compiled kernels"):
        rocm_attn.tuning.set_value("small_seq_mma", 0)
    with pytest.raises(RuntimeError, match="needs the compiled kernels"):
        with rocm_attn.tuning.override(pdl=0):
            pass


@gpu
@needs_kernels
def test_values_override_and_restore():
    before = rocm_attn.tuning.values()
    assert sorted(before) == sorted(header_knobs())
    assert rocm_attn.tuning.environment_names() == header_knobs()
    with rocm_attn.tuning.override(small_seq_mma=0, thd_prefetch=2):
        now = rocm_attn.tuning.values()
        assert now["small_seq_mma"] == 0 and now["thd_prefetch"] == 2
        assert {k: v for k, v in now.items() if k not in ("small_seq_mma", "thd_prefetch")} == \
            {k: v for k, v in before.items() if k not in ("small_seq_mma", "thd_prefetch")}
    assert rocm_attn.tuning.values() == before
    with pytest.raises(ValueError, match="unknown tuning name 'no_such_knob'"):
        rocm_attn.tuning.set_value("no_such_knob", 1)
    with pytest.raises(ValueError, match="32-bit int"):
        rocm_attn.tuning.set_value("pdl", 2**40)
    assert rocm_attn.tuning.values() == before


@gpu
@needs_kernels
def test_environment_is_read_once_at_load():
    """A process started with the variables set sees them at import; changing the environment
    afterwards changes nothing (the launchers never read it again)."""
    code = ("import os, rocm_attn; t = rocm_attn.tuning.values(); "
            "os.environ['ROCM_ATTN_SMALL_SEQ_MMA'] = '3'; "
            "x = rocm_attn.tuning.values()['small_seq_mma']; "
            "print(t['small_seq_mma'], t['thd_prefetch'], t['pdl'], x)")
    env = dict(os.environ, ROCM_ATTN_SMALL_SEQ_MMA="1", ROCM_ATTN_THD_PREFETCH="0",
               ROCM_ATTN_PDL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out == ["1", "0", "0", "1"]
