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


# How to get kernels, appended to the reasons below: the fix belongs in the message.
REBUILD_HINT = ("rebuild against the installed torch, from the source tree: "
                "`python3 -m pip install --no-build-isolation -e .` (a CUDA torch needs nvcc, a "
                "ROCm torch needs hipcc)")


def _not_built_reason() -> str:
    backend = build_config()["backend"]
    if backend != "cpu":
        return (f"rocm_attn._C is missing although the build recorded backend {backend!r}; "
                f"{REBUILD_HINT}")
    if torch.version.cuda is None and torch.version.hip is None:
        return (f"rocm_attn._C is not built: torch {torch.__version__} is a CPU build, so the "
                "torch path serves every call. For the GPU kernels install a CUDA or ROCm "
                f"build of torch, then {REBUILD_HINT}")
    return ("rocm_attn._C is not built: this install was made without kernels (build backend "
            "cpu: ROCM_ATTN_FORCE_CPU=1, BUILD_TARGET=cpu, a CPU torch at build time, or no "
            "GPU compiler and no GPU visible at build time), so the torch path serves every "
            f"call; {REBUILD_HINT}")


def _load() -> bool:
    global _LOAD_ERROR
    if os.environ.get("ROCM_ATTN_FORCE_CPU", "0") not in ("", "0"):
        _LOAD_ERROR = "ROCM_ATTN_FORCE_CPU is set (unset it to use the compiled kernels)"
        log.info("no compiled kernels: %s", _LOAD_ERROR)
        return False
    if importlib.util.find_spec(f"{__package__}._C") is None:
        _LOAD_ERROR = _not_built_reason()
        log.info("no compiled kernels: %s", _LOAD_ERROR)
        return False
    try:
        from . import _C  # noqa: F401  (registers torch.ops.rocm_attn.*)
    except ImportError as exc:
        # Built but unloadable: usually built against another torch (undefined symbols) or a
        # missing GPU runtime library. Worth a warning: the user expects kernels here.
        _LOAD_ERROR = (f"rocm_attn._C failed to load ({exc}); it was probably built against "
                       f"another torch or GPU runtime: {REBUILD_HINT}")
        log.warning("%s. The torch path serves every call.", _LOAD_ERROR)
        return False
    config = build_config()
    log.info("compiled kernels loaded: backend %s, archs %s, %d kernel variants",
             config["backend"], ",".join(config["archs"]) or "-", len(config["kernels"]))
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
