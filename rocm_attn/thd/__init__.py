"""THD context-parallel helpers: partition, reorder, copy, read halves, merge, correct, chunk.

Modules, by responsibility (every public name is re-exported here: ``thd.partition(...)``):

* ``layout.py``     dual-chunk partition / reorders, copy_valid_tokens, read_half, pad_for_cp
* ``merge.py``      merge_partial, lse_correction, out_correction, grad_correction, merge_rows_,
                    add_rows_
* ``chunk.py``      chunkify and the per-ring-step chunk metadata (``ChunkedStep``)
* ``_checks.py``    THD argument checks and the device-value checks (``validate``); the checks
                    every op family shares live in :mod:`rocm_attn._checks`
* ``_index.py``     the sync-free index maps of the torch paths
* ``_dispatch.py``  the kernel slot: torch paths, :func:`register_kernel`, backend choice
* ``_kernels.py``   the compiled kernels behind the slots, their fallbacks and fake impls

Every public function validates its host-side arguments (types, dtypes, devices, ranks,
shapes, host ints), optionally validates the *values* of the device-side ``cu_seqlens``
(``validate=True``, which synchronises), and then calls an implementation with the same name
prefixed ``_torch_`` (vectorised torch: the CPU path and the oracle of the HIP kernels). A
compiled kernel with the same signature as the ``_torch_`` function can be slotted in with
:func:`register_kernel`; ``backend="auto"`` then picks it for tensors on a GPU.

Conventions
-----------
* THD: ``x [t, ...]`` (any trailing dims, e.g. ``[t, h, d]``; any strides). The token dim is
  dim 0 unless a function takes ``dim``. ``cu_seqlens*``: int32 ``[b + 1]`` on ``x``'s device.
* LSE: float32 ``[h, t]`` (token dim **last**). LSE functions take the token dim as the last dim.
* Dual-chunk ("load-balanced") sharding over ``cp`` ranks: the padded length ``L`` of every
  sequence is a multiple of ``2*cp``; the sequence is split into ``2*cp`` chunks of
  ``H = L / (2*cp)`` tokens; rank ``r`` holds chunk ``r`` followed by chunk ``2*cp-1-r`` (its
  *first* and *second half*). The rank-local THD tensor is that, for every sequence in order;
  its ``cu_seqlens_padded`` is the global one divided by ``cp`` (:func:`local_cu_seqlens`).
  Functions that map between global and rank-local layouts take the **global**
  ``cu_seqlens_padded`` (whose entries must all be multiples of ``2*cp``, starting at 0);
  functions working on one rank's tensors take the **local** one (even lengths).
* Slack: a tensor may have more rows than ``cu_seqlens[-1]`` (e.g. the host-known bound
  of :func:`pad_for_cp`). Slack rows are carried along as an extra "sequence" so that every
  layout change is a bijection (partition of all ranks + all-gather + reorder is the identity
  on every row); their contents are junk and never mix with sequence tokens.
* No host-device sync, no ``.item()``/``.tolist()``, no output size derived from device data:
  sizes come from tensor shapes and host ints. Everything is CUDA/HIP-graph capturable and
  traceable by ``torch.compile(fullgraph=True)``. Work scales with tokens (or with
  ``max_chunks`` for the chunk metadata), never with ``max_seqlen * num_seqs``; a token finds
  its sequence by binary search (:func:`token_to_seq`), so nothing caps the number of
  sequences.
* Device values are checked on request: ``validate=True`` (or env ``ROCM_ATTN_VALIDATE=1``)
  reads them on the host (on a GPU this synchronises) and raises ``ValueError`` naming the
  first bad sequence (or row). :func:`partition`, :func:`partitioned_indices`,
  :func:`chunkify`, :func:`pad_for_cp`, :func:`merge_rows_` and :func:`add_rows_` (and
  :func:`rocm_attn.shard_for_cp`) also check by default (``validate=None``) when their tensors
  are on the CPU, where the read costs no sync, except while torch.compile traces the call
  (``validate=False`` skips it). Unchecked, bad values give junk results but never an
  out-of-bounds access (every gather index is clamped into range).
"""

from __future__ import annotations

from .. import _ext
from . import _kernels
from ._dispatch import register_kernel
from .chunk import (ChunkedStep, chunkify, chunkify_above, chunkify_below, chunkify_diagonal,
                    chunkify_ring_step, max_chunks_bound, ring_step)
from .layout import (copy_valid_tokens, local_cu_seqlens, pad_for_cp, padded_size_bound, partition,
                     partitioned_indices, read_half, reorder_to_contiguous,
                     reorder_to_rank_sharded, token_to_seq)
from .merge import (GRAD_OPS, add_rows_, grad_correction, lse_correction, merge_partial,
                    merge_rows_, out_correction)

__all__ = [
    "ChunkedStep",
    "GRAD_OPS",
    "register_kernel",
    "token_to_seq",
    "local_cu_seqlens",
    "partitioned_indices",
    "partition",
    "reorder_to_contiguous",
    "reorder_to_rank_sharded",
    "copy_valid_tokens",
    "read_half",
    "merge_partial",
    "lse_correction",
    "out_correction",
    "grad_correction",
    "merge_rows_",
    "add_rows_",
    "max_chunks_bound",
    "chunkify",
    "ring_step",
    "chunkify_diagonal",
    "chunkify_below",
    "chunkify_above",
    "chunkify_ring_step",
    "padded_size_bound",
    "pad_for_cp",
]

# The compiled kernels fill the slots once every op module above has registered its torch
# path: True when this build has the THD ops (the extension is loaded and has them).
HAS_KERNELS: bool = _ext.HAS_EXTENSION and _kernels.register_compiled_kernels()
