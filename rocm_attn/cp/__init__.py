"""Context-parallel attention (docs/cp.md): :func:`attn_with_cp` and shard helpers.

One module per concern:

* ``api.py``        public entry ``attn_with_cp``: argument / layout checks, plan, dispatch
* ``steps.py``      per-step metadata (q/kv ranges, mask, window) for every comm type
* ``bands.py``      sliding windows and chunking as flash-expressible pieces (host + sync-free)
* ``packed.py``     packed execution of windowed / chunked steps (gather, merge / add by index)
* ``backends.py``   per-step attention: ``reference`` (pure torch), ``torch_flash`` (aten
                    flash varlen, GPU), ``auto``
* ``layouts.py``    materialise a step's tensors (read_half) and fold results back (merge_partial,
                    grad_correction)
* ``comm.py``       group introspection, ring exchange (batched isend/irecv), collectives
* ``p2p.py``, ``all_gather.py``, ``a2a.py``   one ``torch.autograd.Function`` per comm type
* ``shard.py``      ``shard_for_cp`` / ``gather_from_cp``
"""

from .api import COMM_TYPES, attn_with_cp
from .backends import BACKENDS
from .shard import gather_from_cp, shard_for_cp
from .steps import ring_steps_run

__all__ = ["BACKENDS", "COMM_TYPES", "attn_with_cp", "gather_from_cp", "ring_steps_run",
           "shard_for_cp"]
