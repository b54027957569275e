"""Context-parallel attention (docs/cp.md): :func:`attn_with_cp` and shard helpers.

Context parallelism stands on the one-device attention engine (:mod:`rocm_attn.varlen`: step
metadata, mask pieces, packed rows, per-step backends) and the THD helpers
(:mod:`rocm_attn.thd`); what it adds, one module per concern:

* ``api.py``        public entry ``attn_with_cp``: argument / layout checks, plan, dispatch
* ``steps.py``      the plan (``CPPlan``) and the per-step metadata of every comm type's schedule
* ``layouts.py``    materialise a step's tensors (read_half) and fold results back (merge_partial,
                    grad_correction)
* ``comm.py``       group introspection, ring exchange (batched isend/irecv), collectives
* ``autograd.py``   the autograd.Function shape of the p2p ring and all_gather
* ``p2p.py``, ``all_gather.py``, ``a2a.py``, ``a2a_p2p.py``   one comm type each
* ``shard.py``      ``shard_for_cp`` / ``gather_from_cp``
"""

from ..varlen.backends import BACKENDS
from .api import COMM_TYPES, attn_with_cp
from .shard import gather_from_cp, shard_for_cp
from .steps import ring_steps_run

__all__ = ["BACKENDS", "COMM_TYPES", "attn_with_cp", "gather_from_cp", "ring_steps_run",
           "shard_for_cp"]
