"""rocm_attn: ROCm-first attention kernels for PyTorch.

Public API:
  fused_attn_small_seq  candidates of each user over the user's history (fwd + bwd kernels)
  check_errors          raise if a kernel saw a segment that broke its contract
  build_info            what this install was built with
  nn.TargetAttention    target-attention module for recommendation models, on the op
  jagged                torchrec JaggedTensor / lengths-only / int64-offset inputs: the op's adapter
  thd                   context-parallel helpers for packed variable-length (THD) tensors
  reference             float64 reference attention (THD, masks, GQA): the test oracle
  attention             varlen THD attention (causal, sliding window, chunked, padded)
  attn_with_cp          context-parallel attention (p2p ring, all_gather, a2a) over THD shards
  shard_for_cp          global THD tensor -> rank shard (dual-chunk); gather_from_cp: the inverse
  tuning                the kernels' launch tuning values: read, override in-process
"""

from __future__ import annotations

import torch

from . import _logging

_logging.configure_from_env()  # before _ext loads the extension, so its report can show

from . import _ext, jagged, nn, reference, thd, tuning  # noqa: E402
from .errors import SmallSeqContractError, check_errors  # noqa: E402
from .small_seq import fused_attn_small_seq  # noqa: E402
from . import cp  # noqa: E402
from .cp import attn_with_cp, gather_from_cp, shard_for_cp  # noqa: E402
from .varlen import attention  # noqa: E402

__version__ = "0.1.0"


def build_info() -> dict:
    """Backend, arches and kernel variants of this install, and whether they can run here."""
    config = _ext.build_config()
    return {
        "version": __version__,
        "torch": torch.__version__,
        "backend": config["backend"],
        "archs": config["archs"],
        "kernels": config["kernels"],
        "extension_loaded": _ext.HAS_EXTENSION,
        "extension_error": _ext.extension_error(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


__all__ = [
    "SmallSeqContractError",
    "attention",
    "attn_with_cp",
    "build_info",
    "check_errors",
    "cp",
    "fused_attn_small_seq",
    "nn",
    "gather_from_cp",
    "jagged",
    "reference",
    "shard_for_cp",
    "thd",
    "tuning",
]
