"""Launch tuning of the compiled kernels: read the values, override them in-process.

The launchers' choices that the arguments do not fix (matrix-unit or general GQA kernels,
pipelined loops, grid sizes, wide-row THD kernels, the L2 prefetch, overlapped launches) live
in one structure, ``hip_src/common/tuning.h``. Each value is read from its ``ROCM_ATTN_*``
environment variable once, when the extension loads; after that only :func:`override` (or
:func:`set_value`) changes it, for every later launch in this process. A captured graph keeps
the values of its capture. The small-seq values are read by the kernel plan
(rocm_attn.small_seq_plan), which passes the launchers what to run (a compiled graph keeps the
plan of its trace). The README's table of switches lists every name with its variable.

Without the compiled extension there is nothing to tune: :func:`values` is empty and setting a
value raises.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator

from . import _ext
from ._checks import is_int


_generation = 0


def generation() -> int:
    """A count of the changes made through :func:`set_value` in this process (readers cache the
    values per generation)."""
    return _generation


def _module():
    if not _ext.HAS_EXTENSION:
        raise RuntimeError(f"rocm_attn.tuning needs the compiled kernels: {_ext.extension_error()}")
    from . import _C
    return _C


def values() -> Dict[str, int]:
    """The current tuning values by name ({} without the compiled extension)."""
    if not _ext.HAS_EXTENSION:
        return {}
    return {name: value for name, (value, _env) in _module().tuning().items()}


def environment_names() -> Dict[str, str]:
    """The environment variable read at load for each tuning name ({} without the extension)."""
    if not _ext.HAS_EXTENSION:
        return {}
    return {name: env for name, (_value, env) in _module().tuning().items()}


def set_value(name: str, value: int) -> int:
    """Set one tuning value for every later launch in this process; returns the previous one."""
    module = _module()
    if not is_int(value) or not -2**31 <= value < 2**31:
        raise ValueError(f"tuning value for {name!r} must be a 32-bit int, got {value!r}")
    global _generation
    try:
        old = module.set_tuning(name, value)
        _generation += 1
        return old
    except KeyError:
        raise ValueError(f"unknown tuning name {name!r}; known: "
                         f"{', '.join(sorted(values()))}") from None


@contextlib.contextmanager
def override(**new_values: int) -> Iterator[None]:
    """Run a block with some tuning values changed, restoring them after it (A/B runs, tests).

    >>> with rocm_attn.tuning.override(small_seq_mma=0):   # GQA on the general kernels
    ...     out = rocm_attn.fused_attn_small_seq(...)
    """
    saved = {}
    try:
        for name, value in new_values.items():
            saved[name] = set_value(name, value)
        yield
    finally:
        for name, value in saved.items():
            set_value(name, value)
