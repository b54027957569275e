"""One-device varlen attention and the attention engine context parallelism stands on.

:func:`attention` is the public op (``rocm_attn.attention``). Below it, one module per concern,
used by :func:`rocm_attn.attn_with_cp` as well (:mod:`rocm_attn.cp` adds the plan, the comm types
and their step schedules; nothing here imports cp/):

* ``api.py``        ``attention``: checks, the one step, autograd and the compile-path ops
* ``checks.py``     q / k / v and cu_seqlens argument checks shared with ``attn_with_cp``
* ``meta.py``       ``StepMeta`` (one varlen call) and ``DirectCall`` (the same on whole tensors)
* ``bands.py``      sliding windows and chunking as flash-expressible pieces (mask geometry)
* ``pieces.py``     step metadata from those pieces (``whole_sequence_meta``, ``piece_metas``)
* ``packed.py``     packed rows: gather / scatter, merge and add results by row index
* ``backends.py``   per-step attention: ``reference`` (pure torch), ``torch_flash``, ``auto``
* ``autograd.py``   gradients that refuse a second derivative
"""

from .api import attention

__all__ = ["attention"]
