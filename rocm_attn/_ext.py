"""Loading of the compiled extension (rocm_attn._C), if this install has one."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from importlib import resources
from typing import Optional

import torch

log = logging.getLogger("rocm_attn")

_LOAD_ERROR: Optional[str] = None


def _load() -> bool:
    global _LOAD_ERROR
    if os.environ.get("ROCM_ATTN_FORCE_CPU", "0") not in ("", "0"):
        _LOAD_ERROR = "ROCM_ATTN_FORCE_CPU is set"
        return False
    if importlib.util.find_spec(f"{__package__}._C") is None:
        _LOAD_ERROR = (f"rocm_attn._C is not built (build backend: {build_config()['backend']}); "
                       "the torch path serves every call")
        return False
    try:
        from . import _C  # noqa: F401  (registers torch.ops.rocm_attn.*)
    except ImportError as exc:
        _LOAD_ERROR = str(exc)
        return False
    return True




def extension_error() -> Optional[str]:
    """Why the extension is not loaded (None when it is)."""
    return _LOAD_ERROR


def kernels_usable(t: torch.Tensor) -> bool:
    """True when the compiled kernels can run on t's device."""
    return HAS_EXTENSION and t.is_cuda


def build_config() -> dict:
    """What setup.py recorded: backend, arches, kernel variants."""
    try:
        text = resources.files("rocm_attn").joinpath("_build_config.json").read_text()
        return json.loads(text)
    except (FileNotFoundError, OSError, ValueError):
        return {"backend": "cpu", "archs": [], "kernels": []}


HAS_EXTENSION: bool = _load()
