"""The kernel slot of every THD helper: the torch path (the oracle, registered by each op module
with :func:`torch_path`), the compiled implementation slotted in with :func:`register_kernel`,
and :func:`impl`, which picks one for a call and logs the choice with its reason
(docs/design.md#the-oracle-and-the-kernel-slot)."""

from __future__ import annotations

import logging
from typing import Callable, Dict

import torch

from .. import _ext, _logging

_log = logging.getLogger("rocm_attn")

# name -> the torch implementation ``_torch_<name>`` of the op module (the CPU path and the
# oracle of the kernels), filled by @torch_path as the op modules load
TORCH: Dict[str, Callable] = {}
# name -> the compiled implementation in the slot (register_kernel)
KERNELS: Dict[str, Callable] = {}


def torch_path(name: str) -> Callable[[Callable], Callable]:
    """Decorator: ``fn`` is the torch implementation of THD function ``name``."""
    def record(fn: Callable) -> Callable:
        TORCH[name] = fn
        return fn
    return record


def register_kernel(name: str, fn: Callable) -> None:
    """Slot a compiled implementation of ``name`` (e.g. ``"partition"``) behind the public API.

    ``fn`` must have exactly the signature and semantics of the torch path ``_torch_<name>``
    (arguments already validated). ``backend="auto"`` uses it for tensors on a GPU when the
    extension is loaded; ``backend="torch"`` bypasses it; ``backend="kernel"`` requires it.
    """
    if name not in TORCH:
        raise ValueError(f"unknown thd function {name!r}; known: {sorted(TORCH)}")
    KERNELS[name] = fn


def impl(name: str, t: torch.Tensor, backend: str) -> Callable:
    """The implementation of ``name`` for a call on tensors like ``t`` with ``backend`` ("auto":
    the slotted kernel for GPU tensors when the extension is loaded, else the torch path;
    "kernel": the kernel or a ValueError saying why not; "torch": the torch path)."""
    if backend not in ("auto", "kernel", "torch"):
        raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
    if backend != "torch":
        fn = KERNELS.get(name)
        if fn is not None and _ext.kernels_usable(t):
            _logging.log_choice(_log, ("thd", name, "kernel"),
                                "rocm_attn.thd.%s: kernel (a call it cannot serve falls back to "
                                "the torch path, logged with the reason)", name)
            return fn
        if not t.is_cuda:
            why = f"tensors on {t.device}; the kernels run on CUDA and ROCm GPUs"
        else:
            why = _ext.extension_error() or "this build has no kernel for it"
        if backend == "kernel":
            raise ValueError(
                f"backend='kernel': no usable kernel for rocm_attn.thd.{name}: {why}. Use "
                "backend='auto' (falls back to the torch path) or backend='torch'."
            )
        _logging.log_choice(_log, ("thd", name, "torch", why), "rocm_attn.thd.%s: torch path (%s)",
                            name, why)
    return TORCH[name]
