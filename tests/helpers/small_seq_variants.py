"""The one table of small-seq kernel variants the tests force: for every kernel the plan can
return (rocm_attn/small_seq_plan.py VARIANTS), calls whose shape makes the plan pick it, with the
archs on which it does (no helper tests here).

It also holds the tuning the tiled forward's kernel grids force each kernel with
(FWD_FORCINGS), which the GPU and emulation files of that op share.

Served by:
  tests/test_small_seq_variants.py        (CPU) for every entry and listed arch, the plan picks
                                          the entry's launches; every kernel of VARIANTS has an
                                          entry
  tests/test_emu_small_seq_variants.py    (CPU emulation, 64- and 32-lane waves) every entry the
                                          emulated device's plan picks, against the float64
                                          oracles, and the emulator ran the entry's kernels
  tests/test_small_seq_variants_gpu.py    (GPU, marked gpu) every entry the device's plan picks,
                                          against the float64 oracles

A variant is forced only through the plan: by the call's shape (and, where an entry names one,
tuning values the plan reads); the tests never call a launcher branch. An entry's ``launches``
are specs ``kernel(PARAM=value, ...)`` naming the parameters that identify the variant (the
others are not pinned here: tests/test_small_seq_plan.py pins the full records).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from rocm_attn import small_seq_plan as sp

AMD = ("gfx90a", "gfx942", "gfx950")
ALL = AMD + ("sm_90a", "sm_100")


@dataclasses.dataclass(frozen=True)
class VariantCase:
    """One call and the launches the plan gives it (in ``direction``) on ``archs``."""

    name: str
    direction: str                    # "forward" or "backward"
    call: sp.Call
    archs: Tuple[str, ...]
    launches: Tuple[str, ...]
    tuning: Tuple[Tuple[str, int], ...] = ()

    @property
    def kernels(self) -> Tuple[str, ...]:
        return tuple(parse(spec)[0] for spec in self.launches)

    def plan(self, device: sp.Device, base: Optional[Dict[str, int]] = None) -> sp.Plan:
        """This call's plan in its direction on a device, under ``base`` tuning (the defaults
        where None) with the entry's own values on top."""
        t = dict(sp.DEFAULT_TUNING if base is None else base)
        t.update(self.tuning)
        plans = sp.plan_call(dataclasses.replace(self.call,
                                                 backward=self.direction == "backward"),
                             device, t)
        return plans[0] if self.direction == "forward" else plans[1]

    def picked_by(self, plan: sp.Plan) -> bool:
        """Whether a plan's launches are this entry's (kernels in order, named parameters)."""
        return mismatch(plan, self.launches) is None

    def __str__(self) -> str:
        return self.name


def parse(spec: str) -> Tuple[str, Dict[str, str]]:
    """'kernel(A=1, B=true)' -> ('kernel', {'A': '1', 'B': 'true'})."""
    name, _, rest = spec.partition("(")
    params = {}
    for item in filter(None, (p.strip() for p in rest.rstrip(")").split(","))):
        key, _, value = item.partition("=")
        params[key.strip()] = value.strip()
    return name.strip(), params


def mismatch(plan: sp.Plan, specs: Sequence[str]) -> Optional[str]:
    """None where the plan's launches match the specs, else what differs."""
    if len(plan.launches) != len(specs):
        return f"{len(plan.launches)} launches, want {len(specs)}: {plan}"
    for launch, spec in zip(plan.launches, specs):
        name, params = parse(spec)
        if launch.kernel != name:
            return f"{launch.kernel} where {name} was wanted: {plan}"
        got = {k: sp._fmt(v) for k, v in launch.params}
        for key, value in params.items():
            if got.get(key) != value:
                return f"{name}: {key}={got.get(key)}, want {value}: {plan}"
    return None


def _c(d, hq, hkv, q, kv, **kw) -> sp.Call:
    return sp.Call(d, hq, hkv, q, kv, **kw)


def _case(name, direction, call, archs, *launches, tuning=()) -> VariantCase:
    return VariantCase(name, direction, call, tuple(archs), tuple(launches), tuple(tuning))


F, B = "forward", "backward"

VARIANT_CASES: List[VariantCase] = [
    # -- one query per segment, at most 16 keys (hip_src/small_seq/launch_impl.h) --
    _case("fwd_pipe", F, _c(128, 8, 8, 1, 16), ALL, "fwd(KV=16, PIPE=true)"),
    _case("fwd_plain", F, _c(512, 8, 8, 1, 16), ALL, "fwd(KV=16, PIPE=false)"),
    _case("fwd_mma", F, _c(64, 8, 2, 1, 5), ALL, "fwd_mma(KV=8)"),
    _case("bwd_pipe", B, _c(128, 8, 8, 1, 16), ALL, "bwd(KV=16, PIPE=true)"),
    _case("bwd_plain", B, _c(512, 8, 8, 1, 16), ALL, "bwd(KV=16, PIPE=false)"),
    _case("bwd_mma", B, _c(64, 8, 2, 1, 5), ALL, "bwd_mma(KV=8)"),
    _case("bwd_mma_wide", B, _c(128, 16, 1, 1, 16), ALL, "bwd_mma_wide(KV=16)"),
    # -- tiled forward (tiled_launch.hip) --
    # few rows over a long history; d 256 (the wave kernel is its only tiled kernel)
    _case("wave", F, _c(128, 8, 2, 4, 100), AMD, "tiled_fwd_wave(ONE_TILE=false)"),
    _case("wave_d256", F, _c(256, 8, 8, 16, 100), ALL, "tiled_fwd_wave(D=256, ONE_TILE=false)"),
    _case("wave_one_tile", F, _c(128, 8, 2, 4, 16), ALL, "tiled_fwd_wave(ONE_TILE=true)"),
    # 64 rows per (segment, kv head) over keys past the LDS of a resident block
    _case("block256", F, _c(128, 8, 8, 64, 256), ("gfx90a", "gfx942"),
          "tiled_fwd_block(THREADS=256, CP_ASYNC=false)"),
    _case("block256_nvidia", F, _c(128, 8, 8, 32, 100), ("sm_90a", "sm_100"),
          "tiled_fwd_block(THREADS=256, CP_ASYNC=false)"),
    # small blocks (cp.async): 9-16 rows over 17+ keys; 17-32 rows take the wave kernel
    _case("wave_rows32", F, _c(128, 8, 2, 6, 100), ALL, "tiled_fwd_wave(ONE_TILE=false)"),
    _case("block64_cp_async", F, _c(128, 8, 2, 4, 64), ("sm_90a", "sm_100"),
          "tiled_fwd_block(THREADS=64, CP_ASYNC=true)"),
    # 4+ row tiles whose K/V fit shared memory
    _case("resident_step4", F, _c(64, 8, 8, 64, 128), AMD,
          "tiled_fwd_resident(KSTEP=4)"),
    _case("resident_step1", F, _c(128, 8, 8, 64, 48, return_softmax=True), AMD,
          "tiled_fwd_resident(KSTEP=1)"),
    _case("resident_nvidia", F, _c(128, 8, 8, 64, 48, return_softmax=True), ("sm_90a", "sm_100"),
          "tiled_fwd_resident(KSTEP=1)"),
    # Hopper warpgroup-MMA forward (sm_90a builds)
    _case("warpgroup_tma_16", F, _c(128, 8, 8, 64, 16), ("sm_90a",),
          "tiled_fwd_warpgroup_tma(KEYS=16, STREAM=false)"),
    _case("warpgroup_16", F, _c(128, 8, 8, 128, 16), ("sm_90a",),
          "tiled_fwd_warpgroup"),
    _case("warpgroup_tma_64", F, _c(128, 8, 8, 64, 64), ("sm_90a",),
          "tiled_fwd_warpgroup_tma(KEYS=64, STREAM=false)"),
    _case("warpgroup_tma_stream", F, _c(128, 8, 8, 64, 256, layout="bshd"), ("sm_90a",),
          "tiled_fwd_warpgroup_tma(KEYS=64, STREAM=true)"),
    # staging that fills a multiprocessor, no warp-specialized kernel (d 64): streamed
    _case("warpgroup_tma_stream_d64", F, _c(64, 8, 8, 512, 512, layout="bshd"), ("sm_90a",),
          "tiled_fwd_warpgroup_tma(KEYS=64, STREAM=true)"),
    _case("warpgroup_ws_stream", F, _c(128, 8, 2, 300, 1000, layout="bshd"), ("sm_90a",),
          "tiled_fwd_warpgroup_ws"),
    _case("warpgroup_ws", F, _c(128, 8, 8, 128, 256, layout="bshd"), ("sm_90a",),
          "tiled_fwd_warpgroup_ws"),
    # its blocks taking their items from the work queue (the default), or by a grid stride
    _case("warpgroup_ws_queue", F, _c(128, 8, 8, 128, 256), ("sm_90a",),
          "tiled_fwd_warpgroup_ws(grid_factor=1, QUEUE=true)"),
    _case("warpgroup_ws_grid_stride", F, _c(128, 8, 2, 300, 1000), ("sm_90a",),
          "tiled_fwd_warpgroup_ws(grid_factor=4, QUEUE=false)",
          tuning=(("small_seq_tiled_ws_queue", 0),)),
    # -- tiled backward (tiled_bwd_launch.hip) --
    _case("stream_rows1", B, _c(128, 8, 8, 1, 100), ALL,
          "tiled_bwd_delta", "tiled_bwd_stream(ROWS=1)"),
    _case("stream_rows4", B, _c(128, 8, 2, 1, 100), ALL,
          "tiled_bwd_delta", "tiled_bwd_stream(ROWS=4)"),
    # two rows: the four-row instance, partly empty (no row has two; there is no 2-row instance)
    _case("stream_rows2", B, _c(128, 8, 8, 2, 100), ALL,
          "tiled_bwd_delta", "tiled_bwd_stream(ROWS=4)"),
    _case("row_tile_fused", B, _c(128, 8, 2, 4, 16), ALL,
          "tiled_bwd_dkv(ONE_ROW_TILE=true, FUSED_DELTA=true)"),
    _case("row_tile", B, _c(128, 8, 2, 4, 100), ALL,
          "tiled_bwd_delta", "tiled_bwd_dkv(ONE_ROW_TILE=true, FUSED_DELTA=false)"),
    # a dQ pass with fewer than 64 rows: the block variants, every target
    _case("block_passes_two_row_tiles", B, _c(128, 8, 8, 32, 100), ALL,
          "tiled_bwd_delta", "tiled_bwd_dkv_block", "tiled_bwd_dq_block"),
    _case("wave_pass_one_key_tile", B, _c(128, 8, 8, 32, 16), ALL,
          "tiled_bwd_delta", "tiled_bwd_dkv(ONE_ROW_TILE=false, FUSED_DELTA=false)"),
    _case("block_passes", B, _c(128, 8, 8, 64, 100), AMD,
          "tiled_bwd_delta", "tiled_bwd_dkv_block", "tiled_bwd_dq_block"),
    # Hopper warpgroup-MMA backward (sm_90a builds)
    _case("bwd_warpgroup_tma_16", B, _c(128, 8, 8, 64, 16), ("sm_90a",),
          "tiled_bwd_warpgroup_tma(KEYS=16, WITH_DQ=true, FUSED_DELTA=true)"),
    _case("bwd_warpgroup_tma_64", B, _c(128, 8, 8, 64, 64), ("sm_90a",),
          "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=true, FUSED_DELTA=true)"),
    _case("bwd_warpgroup_one_tile", B, _c(128, 8, 8, 64, 256), ("sm_90a",),
          "tiled_bwd_delta", "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=true, TRANSPOSED=true)"),
    _case("bwd_warpgroup_two_tile", B, _c(128, 8, 8, 128, 256), ("sm_90a",),
          "tiled_bwd_delta", "tiled_bwd_warpgroup_two_tile"),
    _case("bwd_warpgroup_dq_tma", B, _c(128, 8, 8, 512, 256), ("sm_90a",),
          "tiled_bwd_warpgroup_dq_tma",
          "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=false, TRANSPOSED=true)"),
    # a GQA group of 3 (no Q box of whole tokens, so no tile copies): the block passes
    _case("bwd_no_tile_copies", B, _c(128, 12, 4, 171, 256), ("sm_90a",),
          "tiled_bwd_delta", "tiled_bwd_dkv_block", "tiled_bwd_dq_block"),
    _case("bwd_warpgroup_dq_stream", B, _c(128, 8, 2, 256, 1000, layout="bshd"), ("sm_90a",),
          "tiled_bwd_warpgroup_dq_stream",
          "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=false, TRANSPOSED=true)"),
    # -- not kernels of hip_src/small_seq (the CPU test only) --
    _case("flash", F, _c(128, 8, 8, 512, 1024), ("sm_90a", "sm_100"), "flash"),
    _case("varlen", F, _c(128, 8, 8, 64, 5000), AMD, "varlen"),
    _case("torch_dtype", F, _c(128, 8, 8, 64, 64, dtype="float32"), ALL, "torch"),
]

# Tuning that sends every call a tiled forward kernel can serve to it (through the plan, which
# reads these values): the GPU and emulation files' grids over kernels (tests/
# test_small_seq_tiled_gpu.py, test_emu_small_seq_tiled.py) take their entries from here. Every
# entry but "auto" (the plan's own choice) turns the warpgroup kernel off (on Hopper it takes 64+
# rows per kv head before the others are asked). The block kernel: its 256-thread instance
# (through registers); the resident kernel: softmax steps of one or four key tiles.
_NO_WG = {"small_seq_tiled_warpgroup": 0}
_BLOCK = {**_NO_WG, "small_seq_tiled_block": 2, "small_seq_tiled_resident": 0}
_RESIDENT = {**_NO_WG, "small_seq_tiled_resident": 2}
FWD_FORCINGS: Dict[str, Dict[str, int]] = {
    "auto": {},
    "wave": {**_NO_WG, "small_seq_tiled_block": 0, "small_seq_tiled_resident": 0},
    "block": _BLOCK,
    "resident": _RESIDENT,
    "resident_step16": {**_RESIDENT, "small_seq_tiled_resident_key_step": 16},
    "resident_step64": {**_RESIDENT, "small_seq_tiled_resident_key_step": 64},
}


def forcings(*names: str) -> Dict[str, Dict[str, int]]:
    """The named entries of FWD_FORCINGS, in that order."""
    return {name: FWD_FORCINGS[name] for name in names}


# Paths that are no kernel of hip_src/small_seq: the GPU and emulation harnesses leave them out.
NOT_KERNELS = ("flash", "varlen", "torch")
ONE_QUERY_KERNELS = ("fwd", "fwd_mma", "bwd", "bwd_mma", "bwd_mma_wide")


def kernel_cases() -> List[VariantCase]:
    """The entries the GPU and emulation harnesses run (small-seq kernels only)."""
    return [c for c in VARIANT_CASES if not set(c.kernels) & set(NOT_KERNELS)]


def template(kernel: str) -> str:
    """The C++ kernel template of a variant (``small_seq_tiled_fwd_block_kernel``)."""
    return sp.VARIANTS[kernel][0].split("<")[0]


def lengths(call: sp.Call) -> Tuple[List[int], List[int]]:
    """Segment lengths of a THD case of the call: segments at the host bounds, shorter ones,
    an empty query segment and an empty history (so the bounds, partial tiles and empties all
    run), kept few so that the CPU emulation stays quick."""
    q, kv = call.max_seqlen_q, call.max_seqlen_kv
    q_lens = [q, max(1, q // 2), 0, 1, q]
    kv_lens = [kv, max(1, kv // 3), 5 if kv >= 5 else kv, 0, max(1, kv - 1)]
    return q_lens, kv_lens


def tiled_case(case: VariantCase, seed: int, device="cpu"):
    """A tiled-kernel input set of the entry's call (bf16; THD or BSHD as the call is; int64
    offsets where the call has them) at the call's host bounds: a TiledCase of
    tests/helpers/small_seq_tiled_cases.py."""
    import torch

    from . import small_seq_tiled_cases as C

    call = case.call
    offsets = torch.int32 if call.int32_offsets else torch.int64
    q_lens, kv_lens = lengths(call)
    if call.layout == "bshd":
        return C.bshd_case(seed, call.max_seqlen_q, kv_lens, call.max_seqlen_kv, call.heads_q,
                           call.heads_kv, call.head_dim, torch.bfloat16, offsets=offsets,
                           device=device)
    return C.thd_case(seed, q_lens, kv_lens, call.heads_q, call.heads_kv, call.head_dim,
                      torch.bfloat16, offsets=offsets, max_q=call.max_seqlen_q,
                      max_kv=call.max_seqlen_kv, device=device)


def one_query_case(case: VariantCase, seed: int, device="cpu"):
    """A one-query input set of the entry's call (bf16 THD, int32 offsets, segments of up to
    max_seqlen_kv keys): a Case of tests/test_small_seq.py."""
    import torch
    from test_small_seq import Rng, thd_case

    call = case.call
    return thd_case(Rng(seed, case.name), 6, call.heads_q, call.heads_kv, call.head_dim,
                    call.max_seqlen_kv, torch.bfloat16, device=device)
