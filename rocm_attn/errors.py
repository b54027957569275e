"""The device error counter: contract violations only the device can see.

Per-segment lengths live on the device, so kernels (and the torch path) check them there: a
segment that breaks the contract is not computed, its outputs are NaN, and a counter records
it. Reading the counter synchronises, so it happens only on request.
"""

from __future__ import annotations

import os
from typing import Dict, Tuple

import torch

from . import _ext

# Counters of the torch path, one int64 [2] tensor per device: [count, lowest bad segment + 1].
_torch_path_state: Dict[torch.device, torch.Tensor] = {}

# Errors of earlier calls that a validate="sync" call took out of the counters before it ran
# (so that it reports only its own): [count, lowest bad segment or -1]. read_errors adds them
# back, so check_errors still reports them.
_set_aside = [0, -1]


class SmallSeqContractError(RuntimeError):
    """A segment broke the fused_attn_small_seq contract (its output is NaN)."""


def _env_on(name: str) -> bool:
    """Whether env ``name`` is set to something other than "" or "0"."""
    if os.name == "posix" and torch.compiler.is_compiling():
        # NOTE: torch 2.4's dynamo cannot trace os.environ.get of an unset variable; the
        # mapping's own dict (bytes keys on POSIX) traces on every supported torch, with a
        # guard on the value, as os.environ.get does on newer ones.
        return os.environ._data.get(name.encode(), b"0") not in (b"", b"0")
    return os.environ.get(name, "0") not in ("", "0")


def validate_mode(validate) -> bool:
    """Resolve the ``validate`` argument: "sync"/True, or env ROCM_ATTN_VALIDATE=1."""
    if validate is None:
        return _env_on("ROCM_ATTN_VALIDATE")
    if validate in (True, "sync"):
        return True
    if validate in (False, "none", "off"):
        return False
    raise ValueError(f"validate must be None, 'sync', True or False, got {validate!r}")


# NOTE: its own namespace, apart from the C++ extension's TORCH_LIBRARY(rocm_attn, ...). The
# schema is spelled out: torch 2.4 cannot infer it from this module's postponed (string)
# annotations.
@torch.library.custom_op("rocm_attn_torch_path::record_errors", mutates_args=("state",),
                         schema="(Tensor(a!) state, Tensor bad) -> ()")
def _record(state: torch.Tensor, bad: torch.Tensor) -> None:
    """state int64 [2] += (number of bad segments, lowest bad segment + 1 if lower or unset).

    A custom op so that torch.compile keeps it as one opaque call that runs every time (a
    traced version would be free to drop a side effect nobody reads)."""
    if bad.numel() == 0:
        return
    idx = torch.arange(1, bad.numel() + 1, device=bad.device)
    first = torch.where(bad, idx, torch.full_like(idx, bad.numel() + 1)).min()
    state[0] += bad.sum()
    # lowest bad segment + 1, or 0 when there is none
    cur = state[1]
    cand = torch.where(first <= bad.numel(), first, torch.zeros_like(first))
    state[1] = torch.where((cur == 0) | ((cand > 0) & (cand < cur)), cand, cur)


@_record.register_fake
def _record_fake(state: torch.Tensor, bad: torch.Tensor) -> None:
    return None


def torch_path_state(device: torch.device) -> torch.Tensor:
    """The torch path's counter of `device` (created on first use)."""
    state = _torch_path_state.get(device)
    if state is None:
        # NOTE: a normal tensor even when the first call runs under torch.inference_mode (a
        # server's first request): an inference tensor could not be updated by later calls
        # outside it
        with torch.inference_mode(False):
            state = _torch_path_state[device] = torch.zeros(2, dtype=torch.int64,
                                                            device=device)
    return state


def exporting() -> bool:
    """Whether torch.export (and so AOTInductor and the dynamo ONNX exporter) or the legacy
    ONNX exporter is tracing the caller."""
    # torch.compiler.is_exporting is newer than the oldest supported torch
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting is not None and is_exporting()) or torch.onnx.is_in_onnx_export()


def record_torch_path_errors(bad: torch.Tensor) -> None:
    """Count bad segments found by the torch path (bad: bool [b]) without a host sync, in
    eager and inside torch.compile alike (the update is one opaque custom op).

    Not while exporting: an exported program cannot hold the process's counter (torch.export
    would lift it as a constant that the graph mutates, which the ONNX exporter refuses, and
    a counter created while tracing would be a fake tensor). Exported programs still write
    NaN for a bad segment's rows; only the count is absent.
    """
    if bad.numel() == 0 or exporting():
        return
    _record(torch_path_state(bad.device), bad)


def _merge(count: int, first: int, c: int, f: int) -> Tuple[int, int]:
    if not c:
        return count, first
    return count + c, f if first < 0 else min(first, f)


def _read_counters(reset: bool) -> Tuple[int, int]:
    """(count, lowest bad segment or -1) of the torch-path and device counters; synchronises."""
    count, first = 0, -1
    for state in _torch_path_state.values():
        c, f = (int(x) for x in state.tolist())
        count, first = _merge(count, first, c, f - 1)
        if reset:
            state.zero_()
    if _ext.HAS_EXTENSION and torch.cuda.is_available():
        c, f = torch.ops.rocm_attn.read_error_state(reset)
        count, first = _merge(count, first, c, f)
    return count, first


def read_errors(reset: bool = True) -> Tuple[int, int]:
    """(count, lowest bad segment or -1) over every device and path; synchronises."""
    count, first = _merge(*_read_counters(reset), *_set_aside)
    if reset:
        _set_aside[:] = [0, -1]
    return count, first


def set_aside_errors() -> None:
    """Move what the counters hold now out of the way of the next call's own errors (kept for
    read_errors / check_errors). Synchronises; only validate="sync" calls do this."""
    _set_aside[:] = _merge(*_set_aside, *_read_counters(reset=True))


def check_call_errors() -> None:
    """Raise SmallSeqContractError for the errors counted since set_aside_errors (the errors of
    the one call between them), and clear them. Synchronises."""
    count, first = _read_counters(reset=True)
    if count:
        raise SmallSeqContractError(_message(count, first))


def check_errors(reset: bool = True) -> None:
    """Raise SmallSeqContractError if any segment broke the contract since the last check.

    Synchronises the device. The message gives the count and the lowest bad segment index.
    """
    count, first = read_errors(reset)
    if count:
        raise SmallSeqContractError(_message(count, first))


def _message(count: int, first: int) -> str:
    return (
        f"fused_attn_small_seq: {count} segment(s) broke the contract (need 0 <= queries <= "
        f"max_seqlen_q, exactly one with max_seqlen_q=1 and int32 offsets, and 0 <= keys <= "
        f"max_seqlen_kv, inside the q and k/v tensors); first bad segment: {first}. Their "
        f"outputs are NaN. Fix the offsets in cu_seqlens_q / cu_seqlens_kv (or seqlens_kv), or "
        f"raise max_seqlen_q / max_seqlen_kv; validate='sync' (env ROCM_ATTN_VALIDATE=1) "
        f"raises at the offending call instead."
    )
