"""The plan of a fused_attn_small_seq call: which kernels serve it and with which parameters.

One pure function, :func:`plan_call`, of the call's shape and host bounds (head dim, q and kv
heads, ``max_seqlen_q``, ``max_seqlen_kv``, layout, offset dtype), dtype, direction, the
device's capabilities (:class:`Device`: wave width, multiprocessors, shared memory, whether the
build and device run the Hopper warpgroup-MMA and tile-copy kernels) and the tuning values.
It answers without a GPU and without the compiled extension (``rocm-attn plan --arch gfx942
...``), so a choice can be tested and asked about on any machine; ``--log-level INFO`` logs the
plan of each call the kernels serve.

Why the plan is Python: the package also installs with no compiled extension (CPU machines,
the pure-Python wheel) and the plan must answer there; aiter picks its kernels in Python too.
The host bounds are host ints, so planning is no device sync and traces under torch.compile.
Compile-time constants the plan needs (tile sizes, shared-memory bytes per variant, the longest
histories) have ONE home here: tools/generate_kernels.py writes a translation unit of
``static_assert``s from this module (:func:`static_checks`) that every build and
tools/check_kernels.py compile, so a kernel header that changes one of them fails the build
until this module agrees. The same unit checks the defaults of :data:`DEFAULT_TUNING` against
hip_src/common/tuning.h.

The ops take their plan as ints (records of hip_src/small_seq/plan.h: :func:`one_query_plans`
for ``small_seq_fwd`` / ``small_seq_bwd``, :func:`tiled_fwd_plan`, :func:`tiled_bwd_plan`) and
their launchers (launch_impl.h, tiled_launch.hip, tiled_bwd_launch.hip) only switch on them and
check them; no launcher reads the tuning. tests/test_small_seq_plan.py pins the plan's choice
for a grid of shapes x archs to what the C++ launchers picked with the default tuning before
they took the plan. Left to the launchers at run
time, because the host shape cannot know them: the grid (a multiple of the blocks the
occupancy API says are resident, which depends on the compiled kernel's registers), the splits
of the staged kernels (from that residency), the backward streaming kernel's item per wave or
per block (from that residency), and tile copies where a tensor's address or stride is not a
multiple of 16 bytes (the plan's fallback, the same call without tile copies, then runs).

This module imports only the standard library at load (tools/generate_kernels.py loads it by
path at build time, before the package is importable); torch is imported where a device or the
tuning of this process is read.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Mapping, Optional, Tuple

# -- compile-time constants of the kernels (checked by the generated static_asserts) ---------

# The one-query kernels (hip_src/small_seq): kv buckets (dispatch.h), waves per block
# (tiling.h kWavesPerBlock), widest GQA group of the one-tile matrix-unit backward
# (bwd_mma_kernel.h kBwdMmaMaxGroup), longest history (small_seq.py MAX_SEQLEN_KV).
ONE_QUERY_KV_BUCKETS = (4, 8, 16)
ONE_QUERY_MAX_SEQLEN_KV = 16
ONE_QUERY_HEAD_DIMS = (64, 128, 256, 512)
WAVES_PER_BLOCK = 2
BWD_MMA_MAX_GROUP = 8
FWD_RESIDENCY_FACTOR = 4
BWD_RESIDENCY_FACTOR = 4

# The tiled kernels: head dims and longest history (tiled_params.h kSmallSeqTiledMaxSeqlenKv).
TILED_HEAD_DIMS = (64, 128, 256)
TILED_MAX_SEQLEN_KV = 4096
TILED_KEYS = 16                  # tiled_fwd_kernel.h kTiledKeys: keys of a key tile
TILED_WAVES_PER_BLOCK = 2        # tiled_fwd_kernel.h kTiledWavesPerBlock
TILED_FWD_RESIDENCY_FACTOR = 4   # kTiledFwdResidencyFactor
# Few rows over long histories take the block kernel's small instance in CUDA builds (two warps,
# 16 rows, three key tiles in flight by cp.async, none in registers), which wins over the wave
# kernel from the second key tile on (16 rows over 64 keys, 4096 users, 8 kv heads, H100: 567 ->
# 470 us fixed, 346 -> 331 ragged); tuning small_seq_tiled_small_block_keys moves that bound.
RESIDENT_ROWS = 16               # tiled_fwd_resident_kernel.h kTiledResidentRows
# The resident kernel where a (segment, kv head) has at least this many row tiles of 16 (fewer
# leave most of a block's waves idle: the wave kernel serves those), in blocks of 256 threads
# (four waves on AMD, eight warps on NVIDIA), several per multiprocessor where their K/V fit,
# so that one stages its next segment while the others compute.
RESIDENT_MIN_TILES = 4
RESIDENT_THREADS = 256           # kTiledResidentThreads
BLOCK_THREADS = 256              # tiled_fwd_kernel.h kTiledBlockThreads: many rows
SHARED_RESERVE = 1024            # kTiledSharedReserve: the runtime's per-block reserve
WARPGROUP_ROWS = 64              # tiled_fwd_warpgroup_kernel.h kTiledWarpgroupRows
WARPGROUP_KEYS = 64              # kTiledWarpgroupKeys: keys of the longest softmax step
TMA_MAX_STEPS = 16               # tiled_fwd_warpgroup_tma_kernel.h kTiledTmaMaxSteps
WS_RING_KEYS = 256               # tiled_fwd_warpgroup_ws_kernel.h kTiledWsRingKeys
WS_THREADS = 384                 # kTiledWsThreads
BWD_KEYS = 16                    # tiled_bwd_kernel.h kTiledBwdKeys
BWD_ROWS = 16                    # kTiledBwdRows
BWD_WAVES_PER_BLOCK = 2          # kTiledBwdWavesPerBlock
BWD_BLOCK_THREADS = 256          # tiled_bwd_block_kernel.h kTiledBwdBlockThreads
BWD_DQ_BLOCK_THREADS = 128       # kTiledBwdDqBlockThreads
BWD_ROW_TILE_THREADS = 128       # tiled_bwd_launch.hip kTiledBwdRowTileThreads
BWD_STREAM_MAX_ROWS = 4          # tiled_bwd_stream_kernel.h kTiledBwdStreamMaxRows
BWD_STREAM_THREADS = 128         # kTiledBwdStreamThreads
BWD_WARPGROUP_BLOCK_KEYS = 64    # tiled_bwd_warpgroup_kernel.h kTiledBwdWarpgroupBlockKeys
# kTiledBwdWarpgroupStagedMaxKeys: the staged dQ kernel's longest history, and the flash
# route rule's bound for a backward on a warpgroup device (route_wins)
BWD_WARPGROUP_MAX_KEYS = 256
BWD_WARPGROUP_STREAM_MAX_KEYS = 4096  # kTiledBwdWarpgroupMaxKeys: with the streaming dQ kernel
BWD_WARPGROUP_CHUNK = 16         # kTiledBwdWarpgroupChunk
BWD_WARPGROUP_DQ_WARPGROUPS = 2  # kTiledBwdWarpgroupDqWarpgroups
BWD_DQ_TMA_BUFFERS = 3           # tiled_bwd_warpgroup_tma_kernel.h kTiledBwdDqTmaBuffers
BWD_DQ_STREAM_STAGES = 4         # tiled_bwd_warpgroup_dq_stream_kernel.h kTiledBwdDqStreamStages
BWD_TWO_TILE_ROWS = 128          # tiled_bwd_warpgroup_two_tile_kernel.h kTiledBwdTwoTileRows


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def rows_for_wave(wave: int) -> int:
    """Rows of a wave kernel's tile (tiled_rows_for_wave): 16 on 64-lane waves, 8 on 32."""
    return 16 if wave == 64 else 8


def resident_smem_bytes(d: int, max_seqlen_kv: int) -> int:
    """tiled_resident_smem_bytes<D>: K and V of whole key tiles at padded strides."""
    return _ceil(max_seqlen_kv, TILED_KEYS) * TILED_KEYS * ((d + 32) + (d + 8)) * 2


def warpgroup_step_keys(max_seqlen_kv: int) -> int:
    """tiled_warpgroup_step_keys: 16-key softmax steps where the history fits one, else 64."""
    return 16 if max_seqlen_kv <= 16 else WARPGROUP_KEYS


def warpgroup_keys(max_seqlen_kv: int) -> int:
    step = warpgroup_step_keys(max_seqlen_kv)
    return _ceil(max_seqlen_kv, step) * step


def warpgroup_smem_bytes(d: int, max_seqlen_kv: int, warpgroups: int) -> int:
    """tiled_warpgroup_smem_bytes<D>: staged K and V, two Q buffers per warpgroup, alignment."""
    return 2 * warpgroup_keys(max_seqlen_kv) * d * 2 + warpgroups * 2 * WARPGROUP_ROWS * d * 2 \
        + 1024


def tma_static_bytes() -> int:
    """tiled_tma_static_bytes: the tile-copy kernel's barriers and room for their alignment."""
    return (TMA_MAX_STEPS + 1 + 2 * 2) * 8 + 64


def stream_smem_bytes(d: int) -> int:
    """tiled_stream_smem_bytes<D>: the streaming instance's two-step K / V ring and Q buffer."""
    return (2 * 2 * WARPGROUP_KEYS + WARPGROUP_KEYS) * d * 2 + WARPGROUP_ROWS * d * 2 + 1024


def ws_smem_bytes(d: int) -> int:
    """tiled_ws_smem_bytes<D>: the warp-specialized kernel's rings and Q buffers."""
    return 2 * WS_RING_KEYS * d * 2 + 2 * 2 * WARPGROUP_ROWS * d * 2 + 1024


def bwd_warpgroup_blocks(max_seqlen_kv: int) -> int:
    return _ceil(max_seqlen_kv, BWD_WARPGROUP_BLOCK_KEYS)


def bwd_warpgroup_smem_bytes(d: int, keys: int) -> int:
    """tiled_bwd_warpgroup_smem_bytes<D>: a dK / dV block of KEYS-key products."""
    return 2 * keys * d * 2 + 2 * 2 * WARPGROUP_ROWS * d * 2 \
        + 2 * WARPGROUP_ROWS * WARPGROUP_KEYS * 2 + 1024


def bwd_warpgroup_dq_tma_smem_bytes(d: int, max_seqlen_kv: int) -> int:
    """tiled_bwd_warpgroup_dq_tma_smem_bytes<D>: the tile-copy dQ block."""
    return 2 * bwd_warpgroup_blocks(max_seqlen_kv) * BWD_WARPGROUP_BLOCK_KEYS * d * 2 \
        + BWD_DQ_TMA_BUFFERS * 2 * WARPGROUP_ROWS * d * 2 + 1024 + 64


def bwd_warpgroup_dq_stream_smem_bytes(d: int) -> int:
    """tiled_bwd_warpgroup_dq_stream_smem_bytes<D>: the ring of K / V steps, Q / dO buffers."""
    return BWD_DQ_STREAM_STAGES * 2 * BWD_WARPGROUP_BLOCK_KEYS * d * 2 \
        + BWD_WARPGROUP_DQ_WARPGROUPS * 2 * WARPGROUP_ROWS * d * 2 + 1024


def bwd_two_tile_smem_bytes(d: int) -> int:
    """tiled_bwd_two_tile_smem_bytes<D>."""
    per_warpgroup = _ceil(2 * WARPGROUP_ROWS * d * 2 + WARPGROUP_ROWS * BWD_WARPGROUP_BLOCK_KEYS * 2
                          + 128 * 16 * 4 + 2 * WARPGROUP_ROWS * 4, 1024) * 1024
    return 2 * BWD_WARPGROUP_BLOCK_KEYS * d * 2 + 2 * per_warpgroup + 1024


def _tiling(d: int, kv: int, wave: int) -> Tuple[int, int]:
    """(slots, vectors per lane) of the one-query kernels' Tiling<D, KV, WAVE> (tiling.h)."""
    vecs_per_row = d // 8
    lanes_per_row = min(vecs_per_row, wave)
    vecs_per_lane = vecs_per_row // lanes_per_row
    rows_per_pass = wave // lanes_per_row
    return _ceil(kv, rows_per_pass), vecs_per_lane


def fwd_pipelinable(d: int, kv: int, wave: int) -> bool:
    """kFwdPipelinable<D, KV> (fwd_kernel.h): all of an item's K/V in one chunk."""
    slots, vpl = _tiling(d, kv, wave)
    chunk = slots if slots < 8 // vpl else 8 // vpl
    return _ceil(slots, chunk) == 1


def bwd_pipelinable(d: int, kv: int, wave: int) -> bool:
    """kBwdPipelinable<D, KV> (bwd_kernel.h)."""
    slots, vpl = _tiling(d, kv, wave)
    return slots * vpl <= 8


# -- tuning ------------------------------------------------------------------------------------

# The small-seq knobs of hip_src/common/tuning.h with their defaults (the generated unit
# static_asserts them against RaTuning{}); rocm_attn.tuning.override changes them in-process.
DEFAULT_TUNING: Dict[str, int] = {
    "small_seq_fwd_grid": -1,
    "small_seq_bwd_grid": -1,
    "small_seq_tiled_fwd_grid": -1,
    "small_seq_tiled_block": 1,
    "small_seq_tiled_small_block_keys": 0,
    "small_seq_tiled_one_tile": 1,
    "small_seq_tiled_resident_key_step": 0,
    "small_seq_tiled_resident": 1,
    "small_seq_tiled_warpgroup": 1,
    "small_seq_tiled_warpgroup_tma": 1,
    "small_seq_tiled_warpgroup_stream": 1,
    "small_seq_tiled_warpgroup_ws": 1,
    "small_seq_tiled_ws_queue": 1,
    "small_seq_tiled_bwd_warpgroup": 1,
    "small_seq_tiled_bwd_two_tile": 1,
    "small_seq_tiled_bwd_dq_stream": 1,
    "small_seq_tiled_bwd_stream": 1,
    "small_seq_tiled_bwd_row_tile": 1,
    "small_seq_flash_route": 1,
    "small_seq_mma": 3,
    "small_seq_pipe": 3,
}


_tuning_cache: Dict[int, Dict[str, int]] = {}


def current_tuning() -> Dict[str, int]:
    """The small-seq tuning values of this process: the defaults, overridden by the compiled
    extension's current values where it is loaded (environment and rocm_attn.tuning); read
    from the extension once per change of a value (rocm_attn.tuning.generation)."""
    from . import tuning

    cached = _tuning_cache.get(tuning.generation())
    if cached is None:
        cached = dict(DEFAULT_TUNING)
        for name, value in tuning.values().items():
            if name in cached:
                cached[name] = value
        _tuning_cache.clear()
        _tuning_cache[tuning.generation()] = cached
    return dict(cached)


# -- devices -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Device:
    """What the plan needs to know of a device and the build that runs on it."""

    arch: str
    vendor: str                     # "amd" or "nvidia"
    wave: int                       # lanes of a wave (64 on CDNA, 32 on NVIDIA)
    multiprocessors: int
    max_shared_per_block: int       # bytes a block may opt in to
    shared_per_multiprocessor: int
    warpgroup_mma: bool = False     # Hopper device and an sm_90a build (ra_device_warpgroup_mma)
    tile_copies: bool = False       # tensor tile copies (RA_TMA_BUILD: an sm_90a CUDA build)
    cp_async: bool = False          # cp.async staging (RA_CP_ASYNC_BUILD: CUDA builds)
    torch_flash: bool = False       # a CUDA build of torch: the flash route may serve


# Per-arch facts for planning without a device (the CLI, the tests): the shipped parts'
# multiprocessor counts (MI250X GCD, MI300X, MI355X, H100 / H200 SXM, B200) and the shared memory
# the runtime reports (AMD: the LDS a workgroup may allocate; NVIDIA: the opt-in limit per
# block and the shared memory of a multiprocessor).
ARCHS: Dict[str, Device] = {
    "gfx90a": Device("gfx90a", "amd", 64, 110, 64 * 1024, 64 * 1024),
    "gfx942": Device("gfx942", "amd", 64, 304, 64 * 1024, 64 * 1024),
    "gfx950": Device("gfx950", "amd", 64, 256, 160 * 1024, 160 * 1024),
    "sm_90a": Device("sm_90a", "nvidia", 32, 132, 227 * 1024, 228 * 1024, warpgroup_mma=True,
                     tile_copies=True, cp_async=True, torch_flash=True),
    "sm_100": Device("sm_100", "nvidia", 32, 148, 227 * 1024, 228 * 1024, cp_async=True,
                     torch_flash=True),
}


@functools.lru_cache(maxsize=None)
def device_of(index: Optional[int] = None) -> Device:
    """The capabilities of a torch device (the current one by default) and this build."""
    import torch

    from . import _ext

    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    hip = torch.version.hip is not None
    arch = props.gcnArchName.split(":")[0] if hip else f"sm_{props.major}{props.minor}"
    table = ARCHS.get(arch)
    wave = getattr(props, "warp_size", 64 if hip else 32)
    per_block = getattr(props, "shared_memory_per_block_optin", 0) or (
        table.max_shared_per_block if table else 48 * 1024)
    per_mp = getattr(props, "shared_memory_per_multiprocessor", 0) or (
        table.shared_per_multiprocessor if table else 64 * 1024)
    warpgroup = False
    if _ext.HAS_EXTENSION:
        from . import _C

        warpgroup = bool(_C.warpgroup_mma())
    return Device(arch, "amd" if hip else "nvidia", wave, props.multi_processor_count,
                  per_block, per_mp, warpgroup_mma=warpgroup, tile_copies=warpgroup,
                  cp_async=not hip, torch_flash=not hip)


# -- the plan ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: the variant (VARIANTS) and its template / launch parameters."""

    kernel: str
    params: Tuple[Tuple[str, object], ...] = ()

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)

    def __str__(self) -> str:
        inner = ", ".join(f"{k}={_fmt(v)}" for k, v in self.params)
        return f"{self.kernel}({inner})" if inner else self.kernel


def _fmt(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _launch(kernel: str, **params) -> Launch:
    assert kernel in VARIANTS, kernel
    return Launch(kernel, tuple(params.items()))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan of one direction of a call: the path ("one_query", "tiled", "flash", "varlen",
    "torch"), the launches in stream order, and why."""

    path: str
    direction: str
    launches: Tuple[Launch, ...] = ()
    reason: str = ""

    @property
    def kernels(self) -> Tuple[str, ...]:
        return tuple(launch.kernel for launch in self.launches)

    def __str__(self) -> str:
        body = " -> ".join(str(launch) for launch in self.launches) or self.path
        return f"{self.direction}: {self.path}: {body}" + (f"  [{self.reason}]" if self.reason
                                                           else "")


# Every variant a plan can name: (C++ template or op, when the plan picks it). The GPU tests
# and the emulation tests take their cases from tests/helpers/small_seq_variants.py.
VARIANTS: Dict[str, Tuple[str, str]] = {
    # one query per segment, max_seqlen_kv <= 16 (hip_src/small_seq/launch_impl.h)
    "fwd": ("small_seq_fwd_kernel<T, D, KV, PIPE>",
            "one q head per kv head, or GQA with small_seq_mma's forward bit off"),
    "fwd_mma": ("small_seq_fwd_mma_kernel<T, D, KV>", "GQA groups (2+ q heads per kv head)"),
    "bwd": ("small_seq_bwd_kernel<T, D, KV, PIPE>", "as fwd"),
    "bwd_mma": ("small_seq_bwd_mma_kernel<T, D, KV>", "GQA groups of 2..8"),
    "bwd_mma_wide": ("small_seq_bwd_mma_wide_kernel<T, D, KV>", "GQA groups wider than 8"),
    # tiled forward (tiled_launch.hip)
    "tiled_fwd_wave": ("small_seq_tiled_fwd_kernel<T, D, ONE_TILE, ROW_MAX>",
                       "d 256, and calls the other tiled kernels do not take"),
    "tiled_fwd_block": ("small_seq_tiled_fwd_block_kernel<T, D, THREADS, CP_ASYNC, ROW_MAX>",
                        "many rows per (segment, kv head) over more than one key tile, or few "
                        "rows over long histories"),
    "tiled_fwd_resident": ("small_seq_tiled_fwd_resident_kernel<T, D, KSTEP, ROW_MAX>",
                           "4+ row tiles per (segment, kv head) whose K/V fit shared memory"),
    "tiled_fwd_warpgroup": ("small_seq_tiled_fwd_warpgroup_kernel<T, D>",
                            "Hopper, 64+ rows per (segment, kv head), d 64 / 128, "
                            "at most 16 keys, where tile copies do not serve"),
    "tiled_fwd_warpgroup_tma": ("small_seq_tiled_fwd_warpgroup_tma_kernel<T, D, KEYS, CAPPED, "
                                "STREAM, ROW_MAX>",
                                "Hopper, 64+ rows per (segment, kv head), d 64 / 128, where "
                                "tile copies serve"),
    "tiled_fwd_warpgroup_ws": ("small_seq_tiled_fwd_warpgroup_ws_kernel<T, D, ROW_MAX>",
                               "Hopper d 128, 129-256 keys, more than one 64-row tile"),
    # tiled backward (tiled_bwd_launch.hip)
    "tiled_bwd_delta": ("small_seq_tiled_bwd_delta_kernel<T, D>",
                        "pass 1 (Delta = rowsum(dO O) - dlse) where no later kernel fuses it"),
    "tiled_bwd_dkv": ("small_seq_tiled_bwd_dkv_kernel<T, D, ONE_ROW_TILE, FUSED_DELTA>",
                      "pass 2; its one-row-tile instance for at most 16 rows"),
    "tiled_bwd_dkv_block": ("small_seq_tiled_bwd_dkv_block_kernel<T, D>",
                            "more than one row tile over more than one key tile"),
    "tiled_bwd_dq_block": ("small_seq_tiled_bwd_dq_block_kernel<T, D>", "as tiled_bwd_dkv_block"),
    "tiled_bwd_stream": ("small_seq_tiled_bwd_stream_kernel<T, D, ROWS>",
                         "at most 4 rows per (segment, kv head)"),
    "tiled_bwd_warpgroup_tma": ("small_seq_tiled_bwd_warpgroup_tma_kernel<T, D, KEYS, WITH_DQ, "
                                "FUSED_DELTA, TRANSPOSED>",
                                "Hopper, 64+ rows per (segment, kv head), at most 4096 keys, "
                                "where tile copies serve"),
    "tiled_bwd_warpgroup_dq_tma": ("small_seq_tiled_bwd_warpgroup_dq_tma_kernel<T, D>",
                                   "warpgroup backward past one key block, at most 256 keys"),
    "tiled_bwd_warpgroup_two_tile": ("small_seq_tiled_bwd_warpgroup_two_tile_kernel<T, D>",
                                     "warpgroup backward, 65-128 rows, past one key block"),
    "tiled_bwd_warpgroup_dq_stream": ("small_seq_tiled_bwd_warpgroup_dq_stream_kernel<T, D>",
                                      "warpgroup backward past 256 keys"),
    # not kernels of hip_src/small_seq
    "flash": ("torch flash varlen + small_seq_flash_contract_{fwd,bwd}",
              "NVIDIA, THD, many candidates over long enough histories"),
    "varlen": ("rocm_attn.attention", "histories beyond the tiled kernels"),
    "torch": ("rocm_attn/small_seq_torch.py", "what no kernel serves"),
}


@dataclasses.dataclass(frozen=True)
class Call:
    """The host-side facts of a call that the plan reads."""

    head_dim: int
    heads_q: int
    heads_kv: int
    max_seqlen_q: int
    max_seqlen_kv: int
    dtype: str = "bfloat16"          # "float16", "bfloat16", "float32", "float64"
    layout: str = "thd"              # "thd" or "bshd"
    int32_offsets: bool = True
    return_softmax: bool = False
    return_lse: bool = False
    backward: bool = False           # the result will be differentiated
    max_logit: bool = False          # the tiled forward also writes each row's maximum logit

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def rows(self) -> int:
        """The most rows of a (segment, kv head): max_seqlen_q x the GQA group (tiled_max_rows)."""
        return self.max_seqlen_q * self.group


# -- the flash route's rule ----------------------------------------------------------------------

# The rule of tuning small_seq_flash_route 1, from the ranking grid's A/B of the route against
# the tiled kernels (docs/kernels.md#flash-route): the route wins where segments have at least
# ROUTE_MIN_QUERIES query rows over a long enough history. Flash tiles each query head on its
# own, so its tiles fill with the candidates alone: a GQA group does not help it, while the tiled
# kernels fold the group into their rows. With a backward ahead 64 keys suffice; forward alone
# needs 128 keys at head dim <= 128. Where the device runs the warpgroup-MMA kernels a forward
# alone at d <= 128 whose segments may hold ROUTE_WARPGROUP_MIN_ROWS rows per kv head over at
# most ROUTE_WARPGROUP_MAX_SEQLEN_KV keys stays tiled (it wins the ranking grid's 256-key rows,
# e.g. 1.37x flash varlen on 256 x 512 x 256; past 256 keys the ragged-request rows measured it at
# 0.78x over 64-384 keys and 0.18-0.32x over 1000-4096 keys: performance.md "Ragged requests"), as
# does (with the warp-specialized kernel on) one at d 128 over 129-256 keys with two
# whole 64-row tiles, and a call to be differentiated at d <= 128 up to the warpgroup
# backward's last key (BWD_WARPGROUP_MAX_KEYS). Where a GQA group of ROUTE_TILED_MIN_GROUP or more
# q heads shares each kv head, the tiled kernels read a history's K / V once for the whole group
# while flash reads it per q head (and sums dK / dV over the group in an extra pass): a call to
# be differentiated stays tiled at any history up to the tiled kernels' last key (the streaming
# dQ kernel past 256 keys), and so does a forward alone past ROUTE_STREAM_MIN_SEQLEN_KV keys,
# where the streaming warpgroup forward takes it, or past WS_RING_KEYS where the warp-specialized
# kernel streams it (two row tiles or more per kv head at d 128): performance.md "Ragged
# requests", the GQA rows over 64-384 and up to 1000-4096 keys and the MQA d 64 row. With the
# warp-specialized kernel streaming past its ring, a forward alone at d 128 of at least
# ROUTE_WS_MIN_ROWS rows per kv head stays tiled up to ROUTE_WS_SEQLEN_KV's last key at any group
# (the MHA row of 16-512 keys), and every forward alone at d 64 stays tiled (the d 64 rows, MHA
# over 8-128 keys and MQA up to 1024). The MHA rows with longer tails (Zipf keys up to 4096), the
# d 256 rows and the MHA backwards measured faster on flash. With a streaming warpgroup forward
# forced (tuning
ROUTE_MIN_QUERIES = 64
ROUTE_MIN_SEQLEN_KV_BACKWARD = 64
ROUTE_MIN_SEQLEN_KV_FORWARD = 128
ROUTE_WARPGROUP_MIN_ROWS = 512
ROUTE_WARPGROUP_MAX_SEQLEN_KV = 256
ROUTE_WS_SEQLEN_KV = (2 * WARPGROUP_KEYS + 1, 2 * WS_RING_KEYS)
ROUTE_WS_MIN_ROWS = 2 * WARPGROUP_ROWS
ROUTE_TILED_MIN_GROUP = 4
ROUTE_STREAM_MIN_SEQLEN_KV = 384


def route_wins(head_dim: int, max_seqlen_q: int, max_seqlen_kv: int, backward: bool,
               warpgroup: bool = False, group: int = 1, warp_specialized: bool = False,
               stream_forced: bool = False) -> bool:
    """The flash route's rule (tuning small_seq_flash_route 1); ``warpgroup``: the device runs
    the tiled kernels' warpgroup-MMA variants; ``warp_specialized``: tuning
    small_seq_tiled_warpgroup_ws is on; ``stream_forced``: tuning
    small_seq_tiled_warpgroup_stream or small_seq_tiled_warpgroup_ws is 2 (a kernel that streams
    K / V takes every forward alone)."""
    if warpgroup and head_dim <= 128:
        if backward and max_seqlen_kv <= BWD_WARPGROUP_MAX_KEYS:
            return False
        if not backward and stream_forced and max_seqlen_kv <= TILED_MAX_SEQLEN_KV:
            return False
        rows = max_seqlen_q * group
        if not backward and head_dim == 64 and max_seqlen_kv <= TILED_MAX_SEQLEN_KV:
            return False
        ws_streams = warp_specialized and head_dim == 128 and rows > WARPGROUP_ROWS
        if (group >= ROUTE_TILED_MIN_GROUP and max_seqlen_kv <= TILED_MAX_SEQLEN_KV
                and (backward or max_seqlen_kv > (WS_RING_KEYS if ws_streams
                                                  else ROUTE_STREAM_MIN_SEQLEN_KV))):
            return False
        if (not backward and rows >= ROUTE_WARPGROUP_MIN_ROWS
                and max_seqlen_kv <= ROUTE_WARPGROUP_MAX_SEQLEN_KV):
            return False
        lo, hi = ROUTE_WS_SEQLEN_KV
        if (not backward and warp_specialized and head_dim == 128 and lo <= max_seqlen_kv <= hi
                and rows >= ROUTE_WS_MIN_ROWS):
            return False
    min_kv = (ROUTE_MIN_SEQLEN_KV_BACKWARD if backward or head_dim > 128
              else ROUTE_MIN_SEQLEN_KV_FORWARD)
    return max_seqlen_q >= ROUTE_MIN_QUERIES and max_seqlen_kv >= min_kv


def route_selects(call: Call, warpgroup: bool, tuning: Mapping[str, int],
                  long_history: bool = False) -> bool:
    """Whether tuning small_seq_flash_route takes the route for this call: 2 always, 1 for
    histories beyond the tiled kernels and where :func:`route_wins`, 0 never (``warpgroup``:
    the device runs the warpgroup-MMA kernels). The caller has checked that the route can serve
    (THD, no return_softmax, a CUDA build of torch)."""
    mode = tuning["small_seq_flash_route"]
    if mode >= 2:
        return True
    if mode != 1:
        return False
    return long_history or route_wins(
        call.head_dim, call.max_seqlen_q, call.max_seqlen_kv, call.backward,
        warpgroup=warpgroup, group=call.group,
        warp_specialized=tuning["small_seq_tiled_warpgroup_ws"] > 0,
        stream_forced=(tuning["small_seq_tiled_warpgroup_stream"] >= 2
                       or tuning["small_seq_tiled_warpgroup_ws"] >= 2))


# -- one-query kernels (launch_impl.h) -----------------------------------------------------------


def kv_bucket(max_seqlen_kv: int) -> int:
    return next(b for b in ONE_QUERY_KV_BUCKETS if max_seqlen_kv <= b)


def plan_one_query(call: Call, device: Device, tuning: Mapping[str, int],
                   direction: str) -> Plan:
    d, kv, group = call.head_dim, kv_bucket(call.max_seqlen_kv), call.group
    forward = direction == "forward"
    bit = 1 if forward else 2
    factor = tuning["small_seq_fwd_grid" if forward else "small_seq_bwd_grid"]
    common = dict(D=d, KV=kv, threads=WAVES_PER_BLOCK * device.wave,
                  grid_factor=factor if factor >= 0 else
                  (FWD_RESIDENCY_FACTOR if forward else BWD_RESIDENCY_FACTOR))
    if group >= 2 and tuning["small_seq_mma"] & bit:
        if forward:
            return Plan("one_query", direction, (_launch("fwd_mma", **common),), "GQA group")
        kernel = "bwd_mma" if group <= BWD_MMA_MAX_GROUP else "bwd_mma_wide"
        return Plan("one_query", direction, (_launch(kernel, **common),), "GQA group")
    pipelinable = fwd_pipelinable(d, kv, device.wave) if forward else \
        bwd_pipelinable(d, kv, device.wave)
    pipe = group == 1 and bool(tuning["small_seq_pipe"] & bit) and pipelinable
    return Plan("one_query", direction, (_launch("fwd" if forward else "bwd", PIPE=pipe,
                                                 **common),))


# -- tiled forward (tiled_launch.hip) ------------------------------------------------------------


def _tma_q_box_fits(call: Call) -> bool:
    """A Q box of a 64-row tile holds whole tokens: the GQA group divides 64."""
    return WARPGROUP_ROWS % call.group == 0


def _fwd_can_stream(call: Call, device: Device, t: Mapping[str, int]) -> bool:
    """Whether the tile-copy kernel's streaming instance can take the call (tuning
    small_seq_tiled_warpgroup_stream not 0): K / V through a ring of 64-key steps, one row tile
    per work item, two blocks per multiprocessor, so any history up to the tiled kernels' last
    key."""
    return (t["small_seq_tiled_warpgroup_stream"] > 0
            and warpgroup_step_keys(call.max_seqlen_kv) == WARPGROUP_KEYS
            and device.tile_copies and t["small_seq_tiled_warpgroup_tma"] > 0
            and _tma_q_box_fits(call)
            and stream_smem_bytes(call.head_dim) + tma_static_bytes()
            <= device.max_shared_per_block)


def _fwd_streams(call: Call, device: Device, t: Mapping[str, int], staged_fits: bool,
                 staged_alone: bool, shares: bool) -> bool:
    """Whether the warpgroup forward takes the streaming instance (tuning
    small_seq_tiled_warpgroup_stream: 2 every call it can serve, 1 the rule below, 0 never).
    The rule: histories whose K / V a block cannot stage whole (past 384 keys at d 128, 832 at
    d 64), and histories whose staging would fill a multiprocessor with one block, unless
    ``shares``: two warpgroups' blocks would fit and the (segment, kv head) has more than one row
    tile, which the warp-specialized kernel serves with its two computing warpgroups."""
    if not _fwd_can_stream(call, device, t):
        return False
    return (t["small_seq_tiled_warpgroup_stream"] >= 2 or not staged_fits
            or (staged_alone and not shares))


def _fwd_warpgroup(call: Call, device: Device, t: Mapping[str, int]) -> Optional[Launch]:
    """The warpgroup-MMA forward (tiled_use_warpgroup and what follows it), or None. Blocks of
    one warpgroup; its 64-key steps only by tile copies (where they cannot serve: the GQA group
    does not divide a 64-row tile, tuning small_seq_tiled_warpgroup_tma 0, or, the plan's
    fallback, tensors whose address or stride is not a multiple of 16 bytes, the kernels below
    take the call); its 16-key steps (histories of at most 16 keys) by cp.async where a
    (segment, kv head) has more than one row tile or tile copies cannot serve."""
    d, kv, rows = call.head_dim, call.max_seqlen_kv, call.rows
    mode = t["small_seq_tiled_warpgroup"]
    if mode <= 0 or d not in (64, 128) or call.return_softmax or not device.warpgroup_mma:
        return None
    if not (mode >= 2 or rows >= WARPGROUP_ROWS):
        return None
    smem = warpgroup_smem_bytes(d, kv, 1)
    staged_fits = smem <= device.max_shared_per_block
    one_block = smem + SHARED_RESERVE
    staged_alone = 2 * one_block > device.shared_per_multiprocessor
    # a block of two warpgroups would share one staging of the history: the warp-specialized
    # kernel's case (d 128, up to its ring)
    shares = (staged_alone and warpgroup_smem_bytes(d, kv, 2) <= device.max_shared_per_block
              and rows > WARPGROUP_ROWS)
    tma_ok = device.tile_copies and t["small_seq_tiled_warpgroup_tma"] > 0 and \
        _tma_q_box_fits(call)
    ws_mode = t["small_seq_tiled_warpgroup_ws"]
    ws_fits = (d == 128 and tma_ok and warpgroup_step_keys(kv) == WARPGROUP_KEYS
               and ws_smem_bytes(d) + SHARED_RESERVE <= device.max_shared_per_block)
    stream = _launch("tiled_fwd_warpgroup_tma", D=d, KEYS=WARPGROUP_KEYS, CAPPED=False,
                     STREAM=True, threads=128, smem=stream_smem_bytes(d))
    if ws_fits and kv > WS_RING_KEYS and (ws_mode >= 2 or (
            ws_mode == 1 and rows > WARPGROUP_ROWS and t["small_seq_tiled_warpgroup_stream"] < 2)):
        # past its ring K / V stream through it in items of a pair of row tiles, one per
        # computing warpgroup: where a (segment, kv head) may hold two row tiles this ran 1.10-1.19x
        # the streaming instance on the long-history GQA ragged rows (H200); one tile would leave
        # a warpgroup idle, so such calls keep the streaming instance
        return _launch("tiled_fwd_warpgroup_ws", D=d, threads=WS_THREADS, smem=ws_smem_bytes(d))
    if _fwd_streams(call, device, t, staged_fits, staged_alone, shares):
        return stream
    if not staged_fits:
        return None
    tma_fits = tma_ok and smem + tma_static_bytes() <= device.max_shared_per_block
    if warpgroup_step_keys(kv) == 16:
        # tile copies where a (segment, kv head) has one row tile, else cp.async
        if tma_fits and rows <= WARPGROUP_ROWS:
            return _launch("tiled_fwd_warpgroup_tma", D=d, KEYS=16, CAPPED=True, STREAM=False,
                           threads=128, smem=smem)
        return _launch("tiled_fwd_warpgroup", D=d, threads=128, smem=smem)
    if ws_fits and ws_mode > 0 and kv <= WS_RING_KEYS and (ws_mode >= 2 or shares):
        return _launch("tiled_fwd_warpgroup_ws", D=d, threads=WS_THREADS, smem=ws_smem_bytes(d))
    if shares and _fwd_can_stream(call, device, t):
        # no warp-specialized kernel here (d 64, past its ring, or off): stream the history
        return stream
    # blocks of one warpgroup staging the history, over 64-key steps; their registers capped
    # for three blocks per multiprocessor (the instance's spill-free cap), also where fewer fit
    # the shared memory
    if tma_fits and warpgroup_keys(kv) // WARPGROUP_KEYS <= TMA_MAX_STEPS:
        return _launch("tiled_fwd_warpgroup_tma", D=d, KEYS=WARPGROUP_KEYS, CAPPED=True,
                       STREAM=False, threads=128, smem=smem)
    return None


def _fwd_resident(call: Call, device: Device, t: Mapping[str, int]) -> Optional[Launch]:
    d, kv = call.head_dim, call.max_seqlen_kv
    mode = t["small_seq_tiled_resident"]
    if mode <= 0 or d > 128:
        return None
    smem = resident_smem_bytes(d, kv)
    if smem > device.max_shared_per_block:
        return None
    if not (mode >= 2 or _ceil(call.rows, RESIDENT_ROWS) >= RESIDENT_MIN_TILES):
        return None
    step = t["small_seq_tiled_resident_key_step"]
    if step not in (TILED_KEYS, 4 * TILED_KEYS):
        step = 4 * TILED_KEYS if kv >= 4 * TILED_KEYS else TILED_KEYS
    return _launch("tiled_fwd_resident", D=d, KSTEP=step // TILED_KEYS,
                   threads=RESIDENT_THREADS, smem=smem)


def _fwd_block_threads(call: Call, device: Device, t: Mapping[str, int]) -> int:
    """tiled_block_threads: the block kernel's threads (BLOCK_THREADS for many rows, two waves
    for few rows over long histories in CUDA builds), 0 where the call does not take it."""
    wave, rows, kv = device.wave, call.rows, call.max_seqlen_kv
    mode = t["small_seq_tiled_block"]
    if mode > 0 and call.head_dim <= 128:
        block_rows = (BLOCK_THREADS // wave) * rows_for_wave(wave)
        if mode >= 2 or (kv > TILED_KEYS and 2 * rows >= block_rows):
            return BLOCK_THREADS
    # small blocks of two warps for at most their 16 rows over long histories (cp.async only)
    if mode != 1 or not device.cp_async:
        return 0
    min_keys = t["small_seq_tiled_small_block_keys"]
    if min_keys <= 0:
        min_keys = TILED_KEYS
    if kv <= min_keys or not rows_for_wave(wave) < rows <= 2 * rows_for_wave(wave):
        return 0
    return 2 * wave


def _with_row_max(launch: Launch, call: Call) -> Launch:
    """The launch with its ROW_MAX parameter (variants that have it): the instance that keeps the
    lazy rescaling and each row's exact maximum apart (tiled_fwd_kernel.h's header NOTE) for a
    call that asks for row maxima (``max_logit``), where the instance's histories may take more
    than one key step. The one-step instances (the wave kernel's one-tile instance, 16-key
    warpgroup steps) have no ROW_MAX twin: they write the exact maximum as they are, never
    rescaling."""
    if "ROW_MAX" not in LAUNCH_PARAMS[launch.kernel]:
        return launch
    one_step = launch.param("ONE_TILE") is True or launch.param("KEYS") == 16
    return Launch(launch.kernel,
                  launch.params + (("ROW_MAX", call.max_logit and not one_step),))


def plan_tiled_forward(call: Call, device: Device, t: Mapping[str, int]) -> Plan:
    """The tiled forward's launch (the table of docs/kernels.md, F1-F6), with its ROW_MAX
    parameter (:func:`_with_row_max`)."""
    plan = _plan_tiled_forward(call, device, t)
    return dataclasses.replace(plan, launches=tuple(_with_row_max(launch, call)
                                                    for launch in plan.launches))


def _with_grid(launch: Launch, grid: int, t: Mapping[str, int]) -> Launch:
    """A staged forward launch with its grid factor; the warp-specialized kernel's also with its
    QUEUE (tuning small_seq_tiled_ws_queue): its blocks take their items from a work queue, one
    block per multiprocessor, instead of a grid stride over ``grid`` x the resident blocks."""
    if launch.kernel != "tiled_fwd_warpgroup_ws":
        return Launch(launch.kernel, launch.params + (("grid_factor", grid),))
    queue = t["small_seq_tiled_ws_queue"] > 0
    return Launch(launch.kernel, launch.params + (("grid_factor", 1 if queue else grid),
                                                  ("QUEUE", queue)))


def _plan_tiled_forward(call: Call, device: Device, t: Mapping[str, int]) -> Plan:
    d, wave = call.head_dim, device.wave
    factor = t["small_seq_tiled_fwd_grid"]
    grid = factor if factor >= 0 else TILED_FWD_RESIDENCY_FACTOR
    if d <= 128:
        for pick in (_fwd_warpgroup, _fwd_resident):
            launch = pick(call, device, t)
            if launch is not None:
                return Plan("tiled", "forward", (_with_grid(launch, grid, t),))
        threads = _fwd_block_threads(call, device, t)
        if threads:
            # the many-row instance stages through registers, the small one by cp.async
            return Plan("tiled", "forward", (_launch(
                "tiled_fwd_block", D=d, THREADS=threads, CP_ASYNC=threads != BLOCK_THREADS,
                grid_factor=grid),))
        if call.max_seqlen_kv <= TILED_KEYS and t["small_seq_tiled_one_tile"] != 0:
            return Plan("tiled", "forward", (_launch(
                "tiled_fwd_wave", D=d, ONE_TILE=True, threads=TILED_WAVES_PER_BLOCK * wave,
                grid_factor=grid),))
    return Plan("tiled", "forward", (_launch(
        "tiled_fwd_wave", D=d, ONE_TILE=False, threads=TILED_WAVES_PER_BLOCK * wave,
        grid_factor=grid),))


# -- tiled backward (tiled_bwd_launch.hip) -------------------------------------------------------


def _bwd_dq_streams(call: Call, device: Device, t: Mapping[str, int]) -> bool:
    """Whether the warpgroup backward's dQ kernel (past one key block) streams K / V through a
    ring (tuning small_seq_tiled_bwd_dq_stream: 1 where the staged kernel cannot hold the
    history, 2 always, 0 never)."""
    mode = t["small_seq_tiled_bwd_dq_stream"]
    if mode != 1:
        return mode >= 2
    return (call.max_seqlen_kv > BWD_WARPGROUP_MAX_KEYS or bwd_warpgroup_dq_tma_smem_bytes(
        call.head_dim, call.max_seqlen_kv) > device.max_shared_per_block)


def _bwd_uses_warpgroup(call: Call, device: Device, t: Mapping[str, int]) -> bool:
    """B1: the warpgroup backward, d 64 / 128, 64+ rows per kv head (any with tuning
    small_seq_tiled_bwd_warpgroup 2), up to BWD_WARPGROUP_STREAM_MAX_KEYS keys where the dQ
    kernel may stream (else the staged dQ kernel's BWD_WARPGROUP_MAX_KEYS), shared memory
    permitting."""
    d, kv = call.head_dim, call.max_seqlen_kv
    mode = t["small_seq_tiled_bwd_warpgroup"]
    max_keys = (BWD_WARPGROUP_STREAM_MAX_KEYS if t["small_seq_tiled_bwd_dq_stream"] >= 1
                else BWD_WARPGROUP_MAX_KEYS)
    if mode <= 0 or d not in (64, 128) or kv > max_keys or not device.warpgroup_mma:
        return False
    limit = device.max_shared_per_block
    if bwd_warpgroup_smem_bytes(d, BWD_WARPGROUP_BLOCK_KEYS) > limit:
        return False
    if kv > BWD_WARPGROUP_BLOCK_KEYS:
        dq_smem = (bwd_warpgroup_dq_stream_smem_bytes(d) if _bwd_dq_streams(call, device, t)
                   else bwd_warpgroup_dq_tma_smem_bytes(d, kv))
        if dq_smem > limit:
            return False
    return mode >= 2 or call.rows >= WARPGROUP_ROWS


def _bwd_warpgroup(call: Call, device: Device, t: Mapping[str, int]) -> Optional[List[Launch]]:
    """The warpgroup backward's launches, or None where the call needs tile copies that the
    device, the tuning (small_seq_tiled_warpgroup_tma 0) or the GQA group (one not dividing a
    64-row tile) does not give: every dK / dV kernel but the two-tile one moves its row tiles
    by tile copies, and the wave / block kernels serve those calls. Histories of one key block:
    one kernel, dQ included, Delta from its own products (no Delta pass). Past one block:
    the one-tile walk for at most one 64-row tile per (segment, kv head), the two-tile kernel
    for at most two (tuning small_seq_tiled_bwd_two_tile), both after the Delta pass; more rows
    take the dQ kernel (Delta from dO and O, run first; K / V staged up to 256 keys, streamed
    past that) and the dK / dV kernel per key block."""
    d, kv, rows = call.head_dim, call.max_seqlen_kv, call.rows
    tma = device.tile_copies and t["small_seq_tiled_warpgroup_tma"] > 0 and _tma_q_box_fits(call)

    def dkdv(keys: int, with_dq: bool, fused_delta: bool, transposed: bool) -> Launch:
        return _launch("tiled_bwd_warpgroup_tma", D=d, KEYS=keys, WITH_DQ=with_dq,
                       FUSED_DELTA=fused_delta, TRANSPOSED=transposed, threads=128,
                       smem=bwd_warpgroup_smem_bytes(d, keys))

    delta = _launch("tiled_bwd_delta", D=d, threads=BWD_WAVES_PER_BLOCK * device.wave)
    if (t["small_seq_tiled_bwd_two_tile"] >= 1 and kv > BWD_WARPGROUP_BLOCK_KEYS
            and WARPGROUP_ROWS < rows <= BWD_TWO_TILE_ROWS):
        return [delta, _launch("tiled_bwd_warpgroup_two_tile", D=d, threads=256,
                               smem=bwd_two_tile_smem_bytes(d))]
    if not tma:
        return None
    if kv <= BWD_WARPGROUP_CHUNK:
        return [dkdv(BWD_WARPGROUP_CHUNK, True, True, False)]
    if kv <= BWD_WARPGROUP_BLOCK_KEYS:
        return [dkdv(BWD_WARPGROUP_BLOCK_KEYS, True, True, False)]
    if rows <= WARPGROUP_ROWS:
        return [delta, dkdv(BWD_WARPGROUP_BLOCK_KEYS, True, False, True)]
    if _bwd_dq_streams(call, device, t):
        dq = _launch("tiled_bwd_warpgroup_dq_stream", D=d,
                     threads=BWD_WARPGROUP_DQ_WARPGROUPS * 128,
                     smem=bwd_warpgroup_dq_stream_smem_bytes(d))
    else:
        dq = _launch("tiled_bwd_warpgroup_dq_tma", D=d, threads=BWD_WARPGROUP_DQ_WARPGROUPS * 128,
                     smem=bwd_warpgroup_dq_tma_smem_bytes(d, kv))
    return [dq, dkdv(BWD_WARPGROUP_BLOCK_KEYS, False, False, True)]


def plan_tiled_backward(call: Call, device: Device, t: Mapping[str, int]) -> Plan:
    d, kv, rows, wave = call.head_dim, call.max_seqlen_kv, call.rows, device.wave
    threads = BWD_WAVES_PER_BLOCK * wave
    if d <= 128 and _bwd_uses_warpgroup(call, device, t):
        launches = _bwd_warpgroup(call, device, t)
        if launches is not None:
            return Plan("tiled", "backward", tuple(launches))
    stream = t["small_seq_tiled_bwd_stream"] > 0 and rows <= BWD_STREAM_MAX_ROWS
    row_tile = not stream and t["small_seq_tiled_bwd_row_tile"] > 0 and rows <= BWD_ROWS
    # the one-row-tile instance computes Delta itself where its items hold every key
    fused = row_tile and kv <= BWD_KEYS
    launches: List[Launch] = [] if fused else [_launch("tiled_bwd_delta", D=d, threads=threads)]
    if stream:
        # the one-row instance, else the four-row one (two or three rows run it partly empty)
        stream_rows = 1 if rows <= 1 else BWD_STREAM_MAX_ROWS
        per = {2: "wave", 3: "block"}.get(t["small_seq_tiled_bwd_stream"], "occupancy")
        launches.append(_launch("tiled_bwd_stream", D=d, ROWS=stream_rows,
                                threads=BWD_STREAM_THREADS, item_per=per))
    elif row_tile:
        launches.append(_launch("tiled_bwd_dkv", D=d, ONE_ROW_TILE=True, FUSED_DELTA=fused,
                                threads=BWD_ROW_TILE_THREADS))
    elif kv > BWD_KEYS and rows > BWD_ROWS:
        # more than one key tile and more than one row tile: a dQ pass, by the block variants
        launches.append(_launch("tiled_bwd_dkv_block", D=d, threads=BWD_BLOCK_THREADS))
        launches.append(_launch("tiled_bwd_dq_block", D=d, threads=BWD_DQ_BLOCK_THREADS))
    else:
        # one key tile (or one row tile): pass 2 computes dQ too
        launches.append(_launch("tiled_bwd_dkv", D=d, ONE_ROW_TILE=False, FUSED_DELTA=False,
                                threads=threads))
    return Plan("tiled", "backward", tuple(launches))


# -- the call --------------------------------------------------------------------------------------

KERNEL_DTYPES = ("float16", "bfloat16")


def _one_query(call: Call) -> bool:
    return (call.max_seqlen_q == 1 and call.max_seqlen_kv <= ONE_QUERY_MAX_SEQLEN_KV
            and call.int32_offsets)


def plan_call(call: Call, device: Device,
              tuning: Optional[Mapping[str, int]] = None) -> Tuple[Plan, ...]:
    """The plans of a call on a device: its forward, and its backward where the call will be
    differentiated (``call.backward``). ``tuning``: the small-seq tuning values
    (:func:`current_tuning` of this process by default; missing names take their defaults)."""
    t = dict(DEFAULT_TUNING)
    t.update(current_tuning() if tuning is None else tuning)
    directions = ("forward", "backward") if call.backward else ("forward",)
    if call.dtype not in KERNEL_DTYPES:
        return tuple(Plan("torch", s, (_launch("torch"),), f"dtype {call.dtype}")
                     for s in directions)
    if _one_query(call):
        if call.head_dim not in ONE_QUERY_HEAD_DIMS:
            return tuple(Plan("torch", s, (_launch("torch"),), f"head dim {call.head_dim}")
                         for s in directions)
        return tuple(plan_one_query(call, device, t, s) for s in directions)
    if call.head_dim not in TILED_HEAD_DIMS:
        return tuple(Plan("torch", s, (_launch("torch"),), f"head dim {call.head_dim}")
                     for s in directions)
    long_history = call.max_seqlen_kv > TILED_MAX_SEQLEN_KV
    route_serves = (device.torch_flash and call.layout == "thd" and not call.return_softmax)
    if long_history:
        if (route_serves and not call.return_lse
                and route_selects(call, device.warpgroup_mma, t, True)):
            return tuple(Plan("flash", s, (_launch("flash"),), "history beyond the tiled kernels")
                         for s in directions)
        return tuple(Plan("varlen", s, (_launch("varlen"),), "history beyond the tiled kernels")
                     for s in directions)
    if route_serves and route_selects(call, device.warpgroup_mma, t):
        return tuple(Plan("flash", s, (_launch("flash"),), "the flash route's rule")
                     for s in directions)
    plans = [plan_tiled_forward(call, device, t)]
    if call.backward:
        plans.append(plan_tiled_backward(call, device, t))
    return tuple(plans)


def describe(call: Call, device: Device, tuning: Optional[Mapping[str, int]] = None) -> str:
    """The plans of a call as text (one line per direction)."""
    head = (f"{device.arch}: d {call.head_dim}, heads {call.heads_q}/{call.heads_kv}, "
            f"max_seqlen_q {call.max_seqlen_q}, max_seqlen_kv {call.max_seqlen_kv}, "
            f"{call.dtype}, {call.layout}")
    return "\n".join([head] + [f"  {p}" for p in plan_call(call, device, tuning)])


def log_plan(logger, q, k, max_seqlen_q: int, max_seqlen_kv: int, layout: str,
             int32_offsets: bool, return_softmax: bool, return_lse: bool, backward: bool) -> None:
    """Log the plan of a call the compiled kernels serve at INFO (each distinct plan once, then
    DEBUG; nothing unless INFO is on): ``rocm-attn --log-level INFO ...`` shows it."""
    import logging

    import torch

    # (is_compiling first: torch.compile traces no Logger method)
    if torch.compiler.is_compiling() or not logger.isEnabledFor(logging.INFO):
        return
    from . import _logging

    call = Call(q.shape[-1], q.shape[-2], k.shape[-2], max_seqlen_q, max_seqlen_kv,
                dtype=str(q.dtype).replace("torch.", ""), layout=layout,
                int32_offsets=int32_offsets, return_softmax=return_softmax,
                return_lse=return_lse, backward=backward)
    text = describe(call, device_of(q.device.index))
    _logging.log_choice(logger, ("small_seq_plan", text), "fused_attn_small_seq plan: %s", text)


# -- launch records: what the compiled launchers switch on ----------------------------------------

# Each launch goes to the op as LAUNCH_INTS ints: the kernel's id, then its parameters in the
# order of LAUNCH_PARAMS (zeros after). hip_src/small_seq/plan.h declares the same ids and
# record (the generated unit checks the ids).
LAUNCH_INTS = 8
KERNEL_IDS: Dict[str, int] = {
    "fwd": 40,
    "fwd_mma": 41,
    "bwd": 42,
    "bwd_mma": 43,
    "bwd_mma_wide": 44,
    "tiled_fwd_wave": 1,
    "tiled_fwd_block": 2,
    "tiled_fwd_resident": 3,
    "tiled_fwd_warpgroup": 4,
    "tiled_fwd_warpgroup_tma": 5,
    "tiled_fwd_warpgroup_ws": 6,
    "tiled_bwd_delta": 10,
    "tiled_bwd_dkv": 11,
    "tiled_bwd_dkv_block": 13,
    "tiled_bwd_dq_block": 14,
    "tiled_bwd_stream": 15,
    "tiled_bwd_warpgroup_tma": 17,
    "tiled_bwd_warpgroup_dq_tma": 19,
    "tiled_bwd_warpgroup_two_tile": 20,
    "tiled_bwd_warpgroup_dq_stream": 21,
}
_KERNEL_ENUM = {
    "fwd": "kFwd",
    "fwd_mma": "kFwdMma",
    "bwd": "kBwd",
    "bwd_mma": "kBwdMma",
    "bwd_mma_wide": "kBwdMmaWide",
    "tiled_fwd_wave": "kTiledFwdWave",
    "tiled_fwd_block": "kTiledFwdBlock",
    "tiled_fwd_resident": "kTiledFwdResident",
    "tiled_fwd_warpgroup": "kTiledFwdWarpgroup",
    "tiled_fwd_warpgroup_tma": "kTiledFwdWarpgroupTma",
    "tiled_fwd_warpgroup_ws": "kTiledFwdWarpgroupWs",
    "tiled_bwd_delta": "kTiledBwdDelta",
    "tiled_bwd_dkv": "kTiledBwdDkv",
    "tiled_bwd_dkv_block": "kTiledBwdDkvBlock",
    "tiled_bwd_dq_block": "kTiledBwdDqBlock",
    "tiled_bwd_stream": "kTiledBwdStream",
    "tiled_bwd_warpgroup_tma": "kTiledBwdWarpgroupTma",
    "tiled_bwd_warpgroup_dq_tma": "kTiledBwdWarpgroupDqTma",
    "tiled_bwd_warpgroup_two_tile": "kTiledBwdWarpgroupTwoTile",
    "tiled_bwd_warpgroup_dq_stream": "kTiledBwdWarpgroupDqStream",
}
LAUNCH_PARAMS: Dict[str, Tuple[str, ...]] = {
    "fwd": ("D", "KV", "PIPE", "grid_factor"),
    "fwd_mma": ("D", "KV", "grid_factor"),
    "bwd": ("D", "KV", "PIPE", "grid_factor"),
    "bwd_mma": ("D", "KV", "grid_factor"),
    "bwd_mma_wide": ("D", "KV", "grid_factor"),
    "tiled_fwd_wave": ("D", "ONE_TILE", "grid_factor", "ROW_MAX"),
    "tiled_fwd_block": ("D", "THREADS", "CP_ASYNC", "grid_factor", "ROW_MAX"),
    "tiled_fwd_resident": ("D", "KSTEP", "grid_factor", "ROW_MAX"),
    "tiled_fwd_warpgroup": ("D", "grid_factor"),
    "tiled_fwd_warpgroup_tma": ("D", "KEYS", "CAPPED", "STREAM", "grid_factor", "ROW_MAX"),
    "tiled_fwd_warpgroup_ws": ("D", "grid_factor", "QUEUE", "ROW_MAX"),
    "tiled_bwd_delta": ("D",),
    "tiled_bwd_dkv": ("D", "ONE_ROW_TILE", "FUSED_DELTA"),
    "tiled_bwd_dkv_block": ("D",),
    "tiled_bwd_dq_block": ("D",),
    "tiled_bwd_stream": ("D", "ROWS", "item_per"),
    "tiled_bwd_warpgroup_tma": ("D", "KEYS", "WITH_DQ", "FUSED_DELTA", "TRANSPOSED"),
    "tiled_bwd_warpgroup_dq_tma": ("D",),
    "tiled_bwd_warpgroup_two_tile": ("D",),
    "tiled_bwd_warpgroup_dq_stream": ("D",),
}
# The streaming backward's items: one per wave or per block by the launcher's occupancy rule, or
# forced (tuning small_seq_tiled_bwd_stream 2 / 3).
STREAM_ITEM_PER = {"occupancy": 0, "wave": 1, "block": 2}


def _record(launch: Launch) -> List[int]:
    values = dict(launch.params)
    ints = [KERNEL_IDS[launch.kernel]]
    ints += [STREAM_ITEM_PER[values[name]] if name == "item_per" else int(values[name])
             for name in LAUNCH_PARAMS[launch.kernel]]
    return ints + [0] * (LAUNCH_INTS - len(ints))


def encode(plan: Plan, fallback: Optional[Plan] = None) -> List[int]:
    """The plan as the op's ``plan`` argument: [launches, fallback launches, then one record of
    LAUNCH_INTS per launch]. The fallback is what the launcher runs where a tile-copy kernel's
    tensor maps cannot be made (an address or stride not a multiple of 16 bytes): the plan of
    the same call without tile copies."""
    rest = fallback.launches if fallback is not None else ()
    ints = [len(plan.launches), len(rest)]
    for launch in plan.launches + rest:
        ints += _record(launch)
    return ints


def _uses_tile_copies(plan: Plan) -> bool:
    return any(launch.kernel.endswith(("_tma", "_ws")) for launch in plan.launches)


def tiled_fwd_ints(call: Call, device: Device, tuning: Mapping[str, int]) -> List[int]:
    """The ``plan`` argument of ``rocm_attn::small_seq_tiled_fwd`` for a call on a device: its
    forward plan and, where that takes a tile-copy kernel, the fallback without tile copies."""
    return list(_tiled_fwd_ints(call, device, tuple(sorted({**DEFAULT_TUNING,
                                                            **tuning}.items()))))


@functools.lru_cache(maxsize=4096)
def _tiled_fwd_ints(call: Call, device: Device,
                    tuning: Tuple[Tuple[str, int], ...]) -> Tuple[int, ...]:
    t = dict(tuning)
    plan = plan_tiled_forward(call, device, t)
    fallback = None
    if _uses_tile_copies(plan):
        fallback = plan_tiled_forward(call, dataclasses.replace(device, tile_copies=False), t)
    return tuple(encode(plan, fallback))


def tiled_bwd_ints(call: Call, device: Device, tuning: Mapping[str, int]) -> List[int]:
    """The ``plan`` argument of ``rocm_attn::small_seq_tiled_bwd`` for a call on a device: its
    backward launches in stream order and, where one takes tile copies, the fallback without."""
    return list(_tiled_bwd_ints(call, device, tuple(sorted({**DEFAULT_TUNING,
                                                            **tuning}.items()))))


@functools.lru_cache(maxsize=4096)
def _tiled_bwd_ints(call: Call, device: Device,
                    tuning: Tuple[Tuple[str, int], ...]) -> Tuple[int, ...]:
    t = dict(tuning)
    plan = plan_tiled_backward(call, device, t)
    fallback = None
    if _uses_tile_copies(plan):
        fallback = plan_tiled_backward(call, dataclasses.replace(device, tile_copies=False), t)
    return tuple(encode(plan, fallback))


def _process_plan_ints(direction: str, head_dim: int, heads_q: int, heads_kv: int,
                       max_seqlen_q: int, max_seqlen_kv: int, return_softmax: bool,
                       device_index: int, max_logit: bool = False) -> Tuple[int, ...]:
    """A tiled op's plan ints for a call on a device of this process (device_index -1: no GPU,
    the gfx942 table) with this process's tuning: host ints in, host ints out, so that
    torch.compile takes the result as a constant of the trace (the tuning and the device
    facts are read outside the traced code; a compiled graph keeps the plan of its trace, as a
    captured graph does)."""
    call = Call(head_dim, heads_q, heads_kv, max_seqlen_q, max_seqlen_kv,
                return_softmax=return_softmax, max_logit=max_logit)
    device = device_of(device_index) if device_index >= 0 else ARCHS["gfx942"]
    encode_ints = tiled_fwd_ints if direction == "forward" else tiled_bwd_ints
    return tuple(encode_ints(call, device, current_tuning()))


def one_query_ints(call: Call, device: Device,
                   tuning: Mapping[str, int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """The ``plan`` and ``backward_plan`` arguments of ``rocm_attn::small_seq_fwd`` for a
    one-query call on a device (the backward's is ``rocm_attn::small_seq_bwd``'s ``plan``): the
    encoded :func:`plan_one_query` of each direction."""
    return _one_query_ints(call, device, tuple(sorted({**DEFAULT_TUNING, **tuning}.items())))


@functools.lru_cache(maxsize=4096)
def _one_query_ints(call: Call, device: Device, tuning: Tuple[Tuple[str, int], ...]
                    ) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    t = dict(tuning)
    return tuple(tuple(encode(plan_one_query(call, device, t, direction)))
                 for direction in ("forward", "backward"))


def _process_one_query_ints(head_dim: int, heads_q: int, heads_kv: int, max_seqlen_kv: int,
                            device_index: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """:func:`one_query_ints` for a call on a device of this process (device_index -1: no GPU,
    the gfx942 table) with this process's tuning: host ints in and out, a constant of the trace
    under torch.compile, as :func:`_process_plan_ints`. No plan (empty ints) for a call the
    one-query kernels do not take: the op refuses it by its own checks, before the plan's."""
    if (head_dim not in ONE_QUERY_HEAD_DIMS or heads_kv <= 0 or heads_q % heads_kv
            or not 1 <= max_seqlen_kv <= ONE_QUERY_MAX_SEQLEN_KV):
        return (), ()
    call = Call(head_dim, heads_q, heads_kv, 1, max_seqlen_kv)
    device = device_of(device_index) if device_index >= 0 else ARCHS["gfx942"]
    return one_query_ints(call, device, current_tuning())


def _mark_constant(fn):
    """fn as torch.compile's constant of a trace (it runs once, outside the traced code); fn
    itself where torch is not importable (tools/generate_kernels.py loads this module alone)."""
    try:
        import torch
    except ImportError:
        return fn
    return torch.compiler.assume_constant_result(fn)


_process_plan_ints_constant = _mark_constant(_process_plan_ints)


_process_one_query_ints_constant = _mark_constant(_process_one_query_ints)


def one_query_plans(q, k, max_seqlen_kv: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """The ``plan`` and ``backward_plan`` arguments of ``rocm_attn::small_seq_fwd`` for a call
    on q's device with this process's tuning (host ints only: no sync; cached per call shape).
    rocm_attn/ops.py small_seq_forward keeps its own per-shape cache in front of this for the
    eager path's host time."""
    return _process_one_query_ints_constant(q.shape[-1], q.shape[-2], k.shape[-2], max_seqlen_kv,
                                            q.device.index if q.is_cuda else -1)


def tiled_bwd_plan(q, k, max_seqlen_q: int, max_seqlen_kv: int) -> List[int]:
    """The ``plan`` argument of ``rocm_attn::small_seq_tiled_bwd`` for a call on q's device
    with this process's tuning (host ints only: no sync; cached per call shape)."""
    return list(_process_plan_ints_constant(
        "backward", q.shape[-1], q.shape[-2], k.shape[-2], max_seqlen_q, max_seqlen_kv, False,
        q.device.index if q.is_cuda else -1))


def tiled_fwd_plan(q, k, max_seqlen_q: int, max_seqlen_kv: int,
                   return_softmax: bool = False, max_logit: bool = False) -> List[int]:
    """The ``plan`` argument of ``rocm_attn::small_seq_tiled_fwd`` for a call on q's device
    with this process's tuning (host ints only: no sync; cached per call shape); ``max_logit``:
    of ``small_seq_tiled_fwd_row_max`` (the ROW_MAX instances)."""
    return list(_process_plan_ints_constant(
        "forward", q.shape[-1], q.shape[-2], k.shape[-2], max_seqlen_q, max_seqlen_kv,
        return_softmax, q.device.index if q.is_cuda else -1, max_logit))


# -- the generated compile-time checks -------------------------------------------------------------


def static_checks() -> str:
    """C++ static_asserts of every constant and shared-memory size the plan reads against the
    kernel headers, and of DEFAULT_TUNING against RaTuning's defaults (written by
    tools/generate_kernels.py into a translation unit every build compiles)."""
    lines = []

    def eq(expr: str, value: int, what: str) -> None:
        lines.append(f'static_assert({expr} == {value}, "rocm_attn/small_seq_plan.py: {what}");')

    for name, value in DEFAULT_TUNING.items():
        eq(f"RaTuning{{}}.{name}", value, f"DEFAULT_TUNING[{name!r}]")
    for expr, value in [
            ("small_seq::kWavesPerBlock", WAVES_PER_BLOCK),
            ("small_seq::kBwdMmaMaxGroup", BWD_MMA_MAX_GROUP),
            ("small_seq::kFwdResidencyFactor", FWD_RESIDENCY_FACTOR),
            ("small_seq::kBwdResidencyFactor", BWD_RESIDENCY_FACTOR),
            ("kSmallSeqTiledMaxSeqlenKv", TILED_MAX_SEQLEN_KV),
            ("small_seq::kTiledKeys", TILED_KEYS),
            ("small_seq::kTiledWavesPerBlock", TILED_WAVES_PER_BLOCK),
            ("small_seq::kTiledFwdResidencyFactor", TILED_FWD_RESIDENCY_FACTOR),
            ("small_seq::kTiledResidentRows", RESIDENT_ROWS),
            ("small_seq::kTiledResidentThreads", RESIDENT_THREADS),
            ("small_seq::kTiledBlockThreads", BLOCK_THREADS),
            ("small_seq::kTiledWarpgroupRows", WARPGROUP_ROWS),
            ("small_seq::kTiledWarpgroupKeys", WARPGROUP_KEYS),
            ("small_seq::kTiledBwdKeys", BWD_KEYS),
            ("small_seq::kTiledBwdRows", BWD_ROWS),
            ("small_seq::kTiledBwdWavesPerBlock", BWD_WAVES_PER_BLOCK),
            ("small_seq::kTiledBwdBlockThreads", BWD_BLOCK_THREADS),
            ("small_seq::kTiledBwdDqBlockThreads", BWD_DQ_BLOCK_THREADS),
            ("small_seq::kTiledBwdStreamMaxRows", BWD_STREAM_MAX_ROWS),
            ("small_seq::kTiledBwdStreamThreads", BWD_STREAM_THREADS),
            ("small_seq::kTiledBwdWarpgroupBlockKeys", BWD_WARPGROUP_BLOCK_KEYS),
            ("small_seq::kTiledBwdWarpgroupStagedMaxKeys", BWD_WARPGROUP_MAX_KEYS),
            ("small_seq::kTiledBwdWarpgroupMaxKeys", BWD_WARPGROUP_STREAM_MAX_KEYS),
            ("small_seq::kTiledBwdDqStreamStages", BWD_DQ_STREAM_STAGES),
            ("small_seq::kTiledBwdWarpgroupChunk", BWD_WARPGROUP_CHUNK),
            ("small_seq::kTiledBwdWarpgroupDqWarpgroups", BWD_WARPGROUP_DQ_WARPGROUPS),
            ("small_seq::kTiledBwdTwoTileRows", BWD_TWO_TILE_ROWS),
            ("small_seq::tiled_rows_for_wave(64)", rows_for_wave(64)),
            ("small_seq::tiled_rows_for_wave(32)", rows_for_wave(32))]:
        eq(expr, value, expr.split("::")[-1])
    for name, kid in KERNEL_IDS.items():
        eq(f"static_cast<int>(SmallSeqKernel::{_KERNEL_ENUM[name]})", kid, f"KERNEL_IDS[{name!r}]")
    eq("kSmallSeqLaunchInts", LAUNCH_INTS, "LAUNCH_INTS")
    for expr, value in [  # launch sizes the launchers apply too (tiled_launch_util.h)
            ("small_seq::kTiledSharedReserve", SHARED_RESERVE),
            ("small_seq::kTiledBwdRowTileThreads", BWD_ROW_TILE_THREADS)]:
        eq(expr, value, expr.split("::")[-1])
    # the tile-copy kernels' headers declare these only in builds that have them (RA_TMA_BUILD)
    lines.append("#if RA_TMA_BUILD")
    eq("small_seq::kTiledTmaMaxSteps", TMA_MAX_STEPS, "kTiledTmaMaxSteps")
    eq("small_seq::kTiledBwdDqTmaBuffers", BWD_DQ_TMA_BUFFERS, "kTiledBwdDqTmaBuffers")
    eq("small_seq::kTiledWsRingKeys", WS_RING_KEYS, "kTiledWsRingKeys")
    eq("small_seq::kTiledWsThreads", WS_THREADS, "kTiledWsThreads")
    eq("small_seq::tiled_tma_static_bytes()", tma_static_bytes(), "tma_static_bytes")
    for d in (64, 128):
        eq(f"small_seq::tiled_ws_smem_bytes<{d}>()", ws_smem_bytes(d), "ws_smem_bytes")
        eq(f"small_seq::tiled_stream_smem_bytes<{d}>()", stream_smem_bytes(d),
           "stream_smem_bytes")
        for kv in (1, 64, 65, 128, 256):
            eq(f"small_seq::tiled_bwd_warpgroup_dq_tma_smem_bytes<{d}>({kv})",
               bwd_warpgroup_dq_tma_smem_bytes(d, kv), "bwd_warpgroup_dq_tma_smem_bytes")
    lines.append("#endif")
    for d in (64, 128):
        eq(f"small_seq::tiled_bwd_two_tile_smem_bytes<{d}>()", bwd_two_tile_smem_bytes(d),
           "bwd_two_tile_smem_bytes")
        eq(f"small_seq::tiled_bwd_warpgroup_dq_stream_smem_bytes<{d}>()",
           bwd_warpgroup_dq_stream_smem_bytes(d), "bwd_warpgroup_dq_stream_smem_bytes")
        for keys in (16, 64):
            eq(f"small_seq::tiled_bwd_warpgroup_smem_bytes<{d}>({keys})",
               bwd_warpgroup_smem_bytes(d, keys), "bwd_warpgroup_smem_bytes")
        for kv in (1, 15, 16, 17, 64, 65, 100, 128, 129, 256, 257, 384, 1000, 4096):
            eq(f"small_seq::tiled_resident_smem_bytes<{d}>({kv})", resident_smem_bytes(d, kv),
               "resident_smem_bytes")
            eq(f"small_seq::tiled_warpgroup_keys({kv})", warpgroup_keys(kv), "warpgroup_keys")
            for wg in (1, 2):
                eq(f"small_seq::tiled_warpgroup_smem_bytes<{d}>({kv}, {wg})",
                   warpgroup_smem_bytes(d, kv, wg), "warpgroup_smem_bytes")
    for d in ONE_QUERY_HEAD_DIMS:
        for kv in ONE_QUERY_KV_BUCKETS:
            lines.append(f"static_assert(small_seq::kFwdPipelinable<{d}, {kv}> == "
                         f"(RA_WAVE_SIZE == 64 ? {_cpp(fwd_pipelinable(d, kv, 64))} : "
                         f"{_cpp(fwd_pipelinable(d, kv, 32))}), \"fwd_pipelinable\");")
            lines.append(f"static_assert(small_seq::kBwdPipelinable<{d}, {kv}> == "
                         f"(RA_WAVE_SIZE == 64 ? {_cpp(bwd_pipelinable(d, kv, 64))} : "
                         f"{_cpp(bwd_pipelinable(d, kv, 32))}), \"bwd_pipelinable\");")
    return "\n".join(lines) + "\n"


def _cpp(flag: bool) -> str:
    return "true" if flag else "false"
