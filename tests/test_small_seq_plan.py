"""The kernel plan of fused_attn_small_seq (rocm_attn/small_seq_plan.py) on the CPU: for a grid of
shapes x archs, the kernels (and their template parameters) the launchers pick with the default
tuning, each case worked out from the launchers' predicates (hip_src/small_seq/launch_impl.h,
tiled_launch.hip, tiled_bwd_launch.hip), so that a change of the plan that changes a choice
fails here; the CLI `rocm-attn plan` for every arch; the tuning knobs' effect on the plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import pytest

from rocm_attn import small_seq_plan as sp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse(spec: str):
    """'kernel(A=1, B=true)' -> ('kernel', {'A': '1', 'B': 'true'})."""
    name, _, rest = spec.partition("(")
    params = {}
    for item in filter(None, (p.strip() for p in rest.rstrip(")").split(","))):
        key, _, value = item.partition("=")
        params[key] = value
    return name.strip(), params


def _check(plan: sp.Plan, want: list, case) -> None:
    assert len(plan.launches) == len(want), (case, str(plan))
    for launch, spec in zip(plan.launches, want):
        name, params = _parse(spec)
        assert launch.kernel == name, (case, str(plan))
        got = {k: sp._fmt(v) for k, v in launch.params}
        for key, value in params.items():
            assert got.get(key) == value, (case, key, str(plan))


def C(d, hq, hkv, q, kv, **kw):
    return sp.Call(d, hq, hkv, q, kv, **kw)


# (arch, call, forward launches, backward launches or None). Each worked from the launcher code
# with the default tuning; the comment names the deciding predicate.
CASES = [
    # one query, int32 offsets, max_seqlen_kv <= 16 (launch_impl.h run_fwd / run_bwd)
    ("gfx942", C(128, 8, 8, 1, 16, backward=True),
     ["fwd(D=128, KV=16, PIPE=true, threads=128)"],             # group 1, kFwdPipelinable
     ["bwd(D=128, KV=16, PIPE=true)"]),                          # 4 slots x 1 vector <= 8
    ("sm_90a", C(128, 8, 8, 1, 16, backward=True),
     ["fwd(D=128, KV=16, PIPE=true, threads=64)"], ["bwd(D=128, KV=16, PIPE=true)"]),
    ("gfx942", C(512, 8, 8, 1, 16, backward=True),
     ["fwd(D=512, KV=16, PIPE=false)"],                          # two chunks of K/V
     ["bwd(D=512, KV=16, PIPE=false)"]),                         # 16 slots > 8
    ("gfx90a", C(64, 8, 2, 1, 5, backward=True),
     ["fwd_mma(D=64, KV=8)"], ["bwd_mma(D=64, KV=8)"]),          # GQA group 4
    ("sm_100", C(256, 32, 2, 1, 3, backward=True),
     ["fwd_mma(D=256, KV=4)"], ["bwd_mma_wide(D=256, KV=4)"]),   # group 16 > kBwdMmaMaxGroup
    # tiled forward on AMD (64 KiB of LDS: no resident kernel past about 100 keys at d 128)
    ("gfx942", C(256, 8, 8, 64, 256, backward=False),
     ["tiled_fwd_wave(D=256, ONE_TILE=false)"], None),           # d 256: the wave kernel only
    ("gfx942", C(128, 8, 2, 1, 16, int32_offsets=False),
     ["tiled_fwd_wave(D=128, ONE_TILE=true)"], None),            # one key tile
    ("gfx942", C(128, 8, 2, 1, 100, int32_offsets=False),
     ["tiled_fwd_wave(D=128, ONE_TILE=false)"], None),           # 4 rows: one wave's tile
    ("gfx942", C(128, 8, 2, 8, 100), ["tiled_fwd_block(D=128, THREADS=256, CP_ASYNC=false)"],
     None),                                                      # 2 x 32 rows >= a 256 block
    ("gfx942", C(128, 8, 2, 6, 100), ["tiled_fwd_wave(D=128, ONE_TILE=false)"],
     None),                                                      # 24 rows: no small block
    ("gfx942", C(64, 8, 8, 64, 128), ["tiled_fwd_resident(D=64, KSTEP=4)"],
     None),                                                      # 4 row tiles, 42 KiB of K/V
    ("gfx942", C(128, 8, 8, 64, 256), ["tiled_fwd_block(D=128, THREADS=256)"], None),
    ("gfx950", C(128, 8, 8, 64, 256), ["tiled_fwd_resident(D=128, KSTEP=4)"],
     None),                                                      # 148 KiB fit 160 KiB of LDS
    # tiled forward on NVIDIA without the warpgroup kernels
    ("sm_100", C(128, 8, 8, 64, 32), ["tiled_fwd_resident(D=128, KSTEP=1)"],
     None),                                                      # eight warps, 16-key steps
    ("sm_100", C(128, 8, 8, 32, 100), ["tiled_fwd_block(D=128, THREADS=256, CP_ASYNC=false)"],
     None),                                                      # many rows: registers
    ("sm_100", C(128, 8, 2, 6, 100), ["tiled_fwd_wave(D=128, ONE_TILE=false)"],
     None),                                                      # 24 rows: no small block
    ("sm_100", C(128, 8, 8, 64, 256, layout="bshd"),
     ["tiled_fwd_resident(D=128, KSTEP=4)"], None),  # one block fills an SM
    ("sm_100", C(128, 8, 2, 2, 64), ["tiled_fwd_wave(D=128, ONE_TILE=false)"], None),
    ("sm_100", C(128, 8, 2, 4, 64), ["tiled_fwd_block(D=128, THREADS=64, CP_ASYNC=true)"],
     None),                                                      # cp.async: bound one key tile
    # tiled forward on Hopper (sm_90a build)
    ("sm_90a", C(128, 8, 8, 64, 16), ["tiled_fwd_warpgroup_tma(D=128, KEYS=16, CAPPED=true, "
                                      "STREAM=false)"], None),
    ("sm_90a", C(128, 8, 8, 128, 16), ["tiled_fwd_warpgroup(D=128)"], None),  # 16-key steps:
    # tile copies only for one row tile
    ("sm_90a", C(128, 8, 8, 64, 100), ["tiled_fwd_warpgroup_tma(D=128, KEYS=64, "
                                       "CAPPED=true, STREAM=false)"], None),
    ("sm_90a", C(128, 8, 8, 64, 256, layout="bshd"),
     ["tiled_fwd_warpgroup_tma(D=128, KEYS=64, STREAM=true)"], None),
    ("sm_90a", C(128, 8, 8, 128, 256, layout="bshd"), ["tiled_fwd_warpgroup_ws(D=128)"], None),
    # histories past the warp-specialized kernel's ring at d 128 with two row tiles per kv
    # head: streamed through its ring in pairs of tiles; one row tile: the streaming instance
    ("sm_90a", C(128, 8, 2, 300, 4096, layout="bshd"), ["tiled_fwd_warpgroup_ws(D=128)"], None),
    ("sm_90a", C(128, 8, 2, 300, 385, layout="bshd"), ["tiled_fwd_warpgroup_ws(D=128)"], None),
    ("sm_90a", C(128, 8, 8, 64, 4096, layout="bshd"),
     ["tiled_fwd_warpgroup_tma(D=128, KEYS=64, CAPPED=false, STREAM=true)"], None),
    # histories no block can stage whole (past 832 keys at d 64): streamed
    ("sm_90a", C(64, 8, 1, 1000, 833, layout="bshd"),
     ["tiled_fwd_warpgroup_tma(D=64, KEYS=64, STREAM=true)"], None),
    ("sm_90a", C(64, 8, 1, 1000, 832, layout="bshd"),
     ["tiled_fwd_warpgroup_tma(D=64, STREAM=true)"], None),   # staged: one warpgroup alone
    # staging that fills a multiprocessor, many row tiles, no warp-specialized kernel (d 64, or
    # past its ring): streamed
    ("sm_90a", C(64, 8, 1, 1000, 640, layout="bshd"),
     ["tiled_fwd_warpgroup_tma(D=64, KEYS=64, STREAM=true)"], None),
    ("sm_90a", C(128, 8, 8, 512, 320, layout="bshd"), ["tiled_fwd_warpgroup_ws(D=128)"], None),
    ("sm_90a", C(64, 8, 8, 512, 512, layout="bshd"),
     ["tiled_fwd_warpgroup_tma(D=64, KEYS=64, CAPPED=false, STREAM=true)"], None),
    ("sm_90a", C(128, 12, 4, 64, 16),
     ["tiled_fwd_warpgroup(D=128)"], None),  # group 3: no Q box
    ("sm_90a", C(128, 12, 4, 64, 100),                              # ... past 16 keys: no
     ["tiled_fwd_resident(D=128, KSTEP=4)"], None),    # warpgroup kernel
    ("sm_90a", C(128, 8, 8, 64, 16, return_softmax=True),
     ["tiled_fwd_resident(D=128, KSTEP=1)"], None),
    # tiled backward, every target
    ("gfx942", C(128, 8, 8, 1, 100, int32_offsets=False, backward=True),
     ["tiled_fwd_wave(D=128, ONE_TILE=false)"],
     ["tiled_bwd_delta(D=128)", "tiled_bwd_stream(D=128, ROWS=1)"]),
    ("gfx942", C(128, 8, 2, 1, 100, int32_offsets=False, backward=True),
     ["tiled_fwd_wave"], ["tiled_bwd_delta", "tiled_bwd_stream(ROWS=4)"]),
    ("gfx942", C(128, 8, 2, 4, 16, backward=True), ["tiled_fwd_wave(ONE_TILE=true)"],
     ["tiled_bwd_dkv(ONE_ROW_TILE=true, FUSED_DELTA=true, threads=128)"]),  # Delta fused
    ("gfx942", C(128, 8, 2, 4, 100, backward=True), ["tiled_fwd_wave(ONE_TILE=false)"],
     ["tiled_bwd_delta", "tiled_bwd_dkv(ONE_ROW_TILE=true, FUSED_DELTA=false)"]),
    ("gfx942", C(128, 8, 8, 64, 100, backward=True), ["tiled_fwd_block(THREADS=256)"],
     ["tiled_bwd_delta", "tiled_bwd_dkv_block(threads=256)", "tiled_bwd_dq_block(threads=128)"]),
    ("gfx942", C(128, 8, 8, 32, 100, backward=True), ["tiled_fwd_block(THREADS=256)"],
     ["tiled_bwd_delta", "tiled_bwd_dkv_block(threads=256)",   # a dQ pass: the block variants
      "tiled_bwd_dq_block(threads=128)"]),
    ("gfx942", C(128, 8, 8, 32, 16, backward=True), ["tiled_fwd_wave(ONE_TILE=true)"],
     ["tiled_bwd_delta", "tiled_bwd_dkv(ONE_ROW_TILE=false)"]),  # one key tile: no dQ pass
    ("sm_100", C(128, 8, 8, 64, 16, layout="bshd", backward=True),
     ["tiled_fwd_resident(KSTEP=1)"],
     ["tiled_bwd_delta(threads=64)", "tiled_bwd_dkv(ONE_ROW_TILE=false, threads=64)"]),
    # warpgroup backward (sm_90a)
    ("sm_90a", C(128, 8, 8, 64, 16, backward=True), ["tiled_fwd_warpgroup_tma(KEYS=16)"],
     ["tiled_bwd_warpgroup_tma(KEYS=16, WITH_DQ=true, FUSED_DELTA=true, TRANSPOSED=false)"]),
    ("sm_90a", C(128, 8, 8, 64, 64, backward=True), ["tiled_fwd_warpgroup_tma(KEYS=64)"],
     ["tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=true, FUSED_DELTA=true, TRANSPOSED=false)"]),
    ("sm_90a", C(128, 8, 8, 64, 256, backward=True), ["tiled_fwd_warpgroup_tma(STREAM=true)"],
     ["tiled_bwd_delta", "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=true, FUSED_DELTA=false, "
                         "TRANSPOSED=true)"]),                  # the one-tile walk
    ("sm_90a", C(128, 8, 8, 128, 256, backward=True), ["tiled_fwd_warpgroup_ws"],
     ["tiled_bwd_delta", "tiled_bwd_warpgroup_two_tile(D=128, threads=256)"]),
    ("sm_90a", C(128, 8, 8, 512, 256, backward=True),
     ["tiled_fwd_warpgroup_ws"],
     ["tiled_bwd_warpgroup_dq_tma(D=128, threads=256)",
      "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=false, FUSED_DELTA=false, TRANSPOSED=true)"]),
    ("sm_90a", C(128, 12, 4, 171, 256, backward=True),   # group 3: no Q box, no tile copies
     ["tiled_fwd_resident(KSTEP=4)"],
     ["tiled_bwd_delta", "tiled_bwd_dkv_block", "tiled_bwd_dq_block"]),
    ("sm_90a", C(128, 8, 8, 512, 257, layout="bshd", backward=True),
     ["tiled_fwd_warpgroup_ws"],
     ["tiled_bwd_warpgroup_dq_stream(D=128, threads=256)",  # past 256 keys
      "tiled_bwd_warpgroup_tma(KEYS=64, WITH_DQ=false, FUSED_DELTA=false, TRANSPOSED=true)"]),
    # other paths
    ("sm_90a", C(128, 8, 8, 512, 512, backward=True), ["flash"], ["flash"]),
    ("sm_100", C(128, 8, 8, 64, 128), ["flash"], None),
    ("gfx942", C(128, 8, 8, 64, 5000, backward=True), ["varlen"], ["varlen"]),
    ("sm_90a", C(128, 8, 8, 64, 5000), ["flash"], None),
    ("sm_90a", C(128, 8, 8, 64, 5000, return_lse=True), ["varlen"], None),
    ("gfx942", C(128, 8, 8, 64, 64, dtype="float32"), ["torch"], None),
    ("gfx942", C(96, 8, 8, 64, 64), ["torch"], None),
]


@pytest.mark.parametrize("arch,call,forward,backward", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_plan_pins_the_launchers_choice(arch, call, forward, backward):
    plans = sp.plan_call(call, sp.ARCHS[arch], sp.DEFAULT_TUNING)
    assert len(plans) == (2 if call.backward else 1)
    _check(plans[0], forward, (arch, call))
    if call.backward:
        _check(plans[1], backward, (arch, call))


def test_every_variant_is_planned_somewhere():
    """The cases above reach every kernel variant of the plan's table."""
    seen = {_parse(spec)[0] for case in CASES for specs in case[2:] if specs for spec in specs}
    assert seen == set(sp.VARIANTS), sorted(set(sp.VARIANTS) - seen)


# The tiled forward's instances (tiled_launch.hip), by their identifying parameters (the
# LAUNCH_PARAMS but D and the grid factor), and what a device must have to run each.
# The last parameter is ROW_MAX: every instance but the one-step ones (one-tile wave, 16-key
# warpgroup steps) has a ROW_MAX twin (tiled_launch.hip).
_TILED_FWD_PLAIN = {
    ("tiled_fwd_wave", (False,)): lambda dev, d: True,
    ("tiled_fwd_wave", (True,)): lambda dev, d: d <= 128,
    ("tiled_fwd_block", (256, False)): lambda dev, d: d <= 128,
    ("tiled_fwd_block", (64, True)): lambda dev, d: d <= 128 and dev.cp_async,
    ("tiled_fwd_resident", (1,)): lambda dev, d: d <= 128,
    ("tiled_fwd_resident", (4,)): lambda dev, d: d <= 128,
    ("tiled_fwd_warpgroup_tma", (16, True, False)): lambda dev, d: d <= 128 and dev.tile_copies,
    ("tiled_fwd_warpgroup_tma", (64, True, False)): lambda dev, d: d <= 128 and dev.tile_copies,
    ("tiled_fwd_warpgroup_tma", (64, False, True)): lambda dev, d: d <= 128 and dev.tile_copies,
    # QUEUE is read at run time: the queue and the grid stride share an instance
    ("tiled_fwd_warpgroup_ws", (False,)): lambda dev, d: d == 128 and dev.tile_copies,
    ("tiled_fwd_warpgroup_ws", (True,)): lambda dev, d: d == 128 and dev.tile_copies,
}
_ONE_STEP = {("tiled_fwd_wave", (True,)), ("tiled_fwd_warpgroup_tma", (16, True, False))}
TILED_FWD_INSTANCES = {
    **{(name, ident + (row_max,)): runs for (name, ident), runs in _TILED_FWD_PLAIN.items()
       for row_max in (False, True) if not (row_max and (name, ident) in _ONE_STEP)},
    ("tiled_fwd_warpgroup", ()): lambda dev, d: d <= 128 and dev.warpgroup_mma,
}
FORCED_TUNINGS = [{}, {"small_seq_tiled_warpgroup": 2}, {"small_seq_tiled_warpgroup_tma": 0},
                  {"small_seq_tiled_warpgroup": 2, "small_seq_tiled_warpgroup_tma": 0},
                  {"small_seq_tiled_warpgroup_stream": 0}, {"small_seq_tiled_warpgroup_stream": 2},
                  {"small_seq_tiled_warpgroup_ws": 0}, {"small_seq_tiled_warpgroup_ws": 2},
                  {"small_seq_tiled_ws_queue": 0},
                  {"small_seq_tiled_block": 2}, {"small_seq_tiled_resident": 2},
                  {"small_seq_tiled_warpgroup": 0, "small_seq_tiled_resident": 0},
                  {"small_seq_tiled_resident_key_step": 16},
                  {"small_seq_tiled_small_block_keys": 64}, {"small_seq_tiled_one_tile": 0}]


def test_every_tiled_forward_call_gets_a_compiled_instance():
    """Every call the tiled forward takes (every head dim, GQA groups whose Q tiles hold whole
    tokens and ones that do not, one row to many over one key to the last, THD and BSHD,
    probabilities returned or not), on every arch, under the default and the forcing tunings,
    and the plan's fallback where tile copies cannot serve (unaligned tensors: the same call on
    the device without them), gets an instance the launcher compiles for that device: the
    variants deleted for winning no benchmark row left no call without a kernel."""
    for arch, device in sp.ARCHS.items():
        devices = [device, dataclasses.replace(device, tile_copies=False)]
        for dev, t, d, (hq, hkv), q, kv, layout, probs, max_logit in itertools.product(
                devices, FORCED_TUNINGS, sp.TILED_HEAD_DIMS, [(8, 8), (12, 4), (8, 2), (8, 1)],
                [1, 4, 6, 16, 64, 128, 512], [5, 16, 17, 100, 256, 320, 833, 4096],
                ["thd", "bshd"], [False, True], [False, True]):
            call = C(d, hq, hkv, q, kv, layout=layout, return_softmax=probs, max_logit=max_logit)
            plan = sp.plan_tiled_forward(call, dev, dict(sp.DEFAULT_TUNING, **t))
            (launch,) = plan.launches
            ident = tuple(launch.param(name) for name in sp.LAUNCH_PARAMS[launch.kernel]
                          if name not in ("D", "grid_factor"))
            runs = TILED_FWD_INSTANCES.get((launch.kernel, ident))
            assert runs is not None and runs(dev, d), (arch, dev.tile_copies, t, call, str(plan))
            if launch.kernel == "tiled_fwd_warpgroup":  # its one instance takes 16-key steps
                assert sp.warpgroup_step_keys(kv) == 16, (arch, t, call, str(plan))


def test_tuning_knobs_change_the_plan():
    gfx, hopper = sp.ARCHS["gfx942"], sp.ARCHS["sm_90a"]
    t = dict(sp.DEFAULT_TUNING)
    call = C(64, 8, 2, 1, 16, backward=True)
    assert sp.plan_call(call, gfx, dict(t, small_seq_mma=0))[0].kernels == ("fwd",)
    assert sp.plan_call(call, gfx, dict(t, small_seq_mma=1))[1].kernels == ("bwd",)
    call = C(128, 8, 8, 64, 16)
    assert sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup=0))[0].kernels == (
        "tiled_fwd_resident",)
    assert sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_tma=0))[0].kernels == (
        "tiled_fwd_warpgroup",)
    # the streaming warpgroup forward: 0 never (long histories fall back to the kernels that
    # stream per row tile), 2 every call it can serve, ragged-request rows routed to flash
    # varlen by default included
    call = C(128, 8, 2, 300, 4096, layout="bshd")
    assert sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_stream=0,
                                           small_seq_tiled_warpgroup_ws=0))[0].kernels \
        == ("tiled_fwd_block",)
    call = C(128, 8, 8, 300, 4096)  # MHA: the route by default
    assert sp.plan_call(call, hopper, t)[0].kernels == ("flash",)
    plan = sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_stream=2))[0]
    assert plan.kernels == ("tiled_fwd_warpgroup_tma",) and plan.launches[0].param("STREAM")
    # a group of 4 at d 128: the warp-specialized kernel streams past its ring by default (pairs
    # of row tiles), kept off the route; with the streaming instance forced, that instance; d 64
    # has no such kernel and streams on the one-warpgroup instance
    call = C(128, 8, 2, 300, 4096)
    assert sp.plan_call(call, hopper, t)[0].kernels == ("tiled_fwd_warpgroup_ws",)
    plan = sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_stream=2))[0]
    assert plan.kernels == ("tiled_fwd_warpgroup_tma",) and plan.launches[0].param("STREAM")
    assert sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_ws=2))[0].kernels == (
        "tiled_fwd_warpgroup_ws",)
    # that kernel's blocks, one per multiprocessor, take their items from the work queue
    # (tuning small_seq_tiled_ws_queue 1); 0: a grid stride; no other kernel has a queue
    (queued,) = sp.plan_call(call, hopper, t)[0].launches
    assert queued.param("QUEUE") is True and queued.param("grid_factor") == 1
    assert sp.encode(sp.plan_call(call, hopper, t)[0])[2:7] == [
        sp.KERNEL_IDS["tiled_fwd_warpgroup_ws"], 128, 1, 1, 0]
    (strided,) = sp.plan_call(call, hopper, dict(t, small_seq_tiled_ws_queue=0))[0].launches
    assert strided.param("QUEUE") is False and strided.param("grid_factor") == 4
    (other,) = sp.plan_call(C(64, 8, 2, 300, 4096), hopper, t)[0].launches
    assert other.param("QUEUE") is None and other.param("grid_factor") == 4
    call = C(64, 8, 2, 300, 4096, layout="bshd")
    assert sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_ws=2))[0].launches[0] \
        .param("STREAM")
    call = C(64, 8, 8, 64, 256)  # staged fits, one tile: stages unless forced
    assert not sp.plan_call(call, hopper, t)[0].launches[0].param("STREAM")
    assert sp.plan_call(call, hopper, dict(t, small_seq_tiled_warpgroup_stream=2))[0] \
        .launches[0].param("STREAM")
    call = C(128, 8, 2, 4, 100, backward=True)
    plan = sp.plan_call(call, gfx, dict(t, small_seq_tiled_bwd_row_tile=0))[1]
    assert plan.kernels == ("tiled_bwd_delta", "tiled_bwd_dkv")  # 16 rows: no dQ pass
    assert plan.launches[1].param("ONE_ROW_TILE") is False
    grid = sp.plan_call(call, gfx, dict(t, small_seq_tiled_fwd_grid=0))[0]
    assert grid.launches[0].param("grid_factor") == 0


def test_warpgroup_backward_long_histories():
    """B1 up to the tiled kernels' 4096 keys (d 64 / 128, MHA / GQA / MQA): past the staged dQ
    kernel's 256 keys the dQ kernel streams K / V (its shared memory independent of the
    history), the one- and two-tile walks and the per-key-block dK / dV kernel serve any length;
    tuning small_seq_tiled_bwd_dq_stream 0 restores the 256-key bound, 2 streams at every
    length past one key block; the flash route's rule keeps its own 256-key backward bound."""
    hopper = sp.ARCHS["sm_90a"]
    t = dict(sp.DEFAULT_TUNING)

    def bwd(call, **knobs):
        return sp.plan_tiled_backward(call, hopper, dict(t, **knobs))

    for d in (64, 128):
        smem = sp.bwd_warpgroup_dq_stream_smem_bytes(d)
        assert smem == (4 * 2 * 64 * d * 2 + 2 * 2 * 64 * d * 2 + 1024)
        assert smem <= hopper.max_shared_per_block
        for kv in (257, 300, 1000, 4095, 4096):
            for hq, hkv in ((8, 8), (8, 2), (8, 1)):
                call = C(d, hq, hkv, 300, kv, layout="bshd", backward=True)
                plan = bwd(call)
                assert plan.kernels == ("tiled_bwd_warpgroup_dq_stream",
                                        "tiled_bwd_warpgroup_tma"), str(plan)
                dq, dkdv = plan.launches
                assert dq.param("smem") == smem
                assert dkdv.param("TRANSPOSED") is True and dkdv.param("WITH_DQ") is False
                # without tile copies (the launcher's fallback) the mma.sync block passes
                assert sp.plan_tiled_backward(
                    call, dataclasses.replace(hopper, tile_copies=False), t).kernels == (
                    "tiled_bwd_delta", "tiled_bwd_dkv_block", "tiled_bwd_dq_block")
                # the bound of before: the mma.sync block passes
                assert bwd(call, small_seq_tiled_bwd_dq_stream=0).kernels == (
                    "tiled_bwd_delta", "tiled_bwd_dkv_block", "tiled_bwd_dq_block")
        # the staged dQ kernel keeps 65-256 keys; tuning 2 streams there too
        call = C(d, 8, 2, 300, 256, layout="bshd", backward=True)
        assert bwd(call).kernels[0] == "tiled_bwd_warpgroup_dq_tma"
        assert bwd(call, small_seq_tiled_bwd_dq_stream=2).kernels[0] == (
            "tiled_bwd_warpgroup_dq_stream")
        assert bwd(C(d, 8, 2, 300, 64, layout="bshd", backward=True),
                   small_seq_tiled_bwd_dq_stream=2).kernels == ("tiled_bwd_warpgroup_tma",)
    # rows of one and two 64-row tiles walk their key blocks, any length
    assert bwd(C(128, 8, 2, 16, 4096, backward=True, layout="bshd")).kernels == (
        "tiled_bwd_delta", "tiled_bwd_warpgroup_tma")
    assert bwd(C(128, 8, 2, 32, 4096, backward=True, layout="bshd")).kernels == (
        "tiled_bwd_delta", "tiled_bwd_warpgroup_two_tile")
    # past the tiled kernels: no tiled plan at all
    assert sp.plan_call(C(128, 8, 2, 300, 4097, layout="bshd", backward=True), hopper,
                        t)[1].path == "varlen"
    # the route's rule: THD calls of 64+ candidates past 256 keys take the warpgroup backward
    # (the streaming dQ kernel) with a GQA group of 4+, the route with MHA (and with the route
    # off, the warpgroup backward too)
    assert not sp.route_wins(128, 300, 256, True, warpgroup=True, group=4)
    assert not sp.route_wins(128, 300, 257, True, warpgroup=True, group=4)
    assert sp.route_wins(128, 300, 257, True, warpgroup=True, group=1)
    thd = C(128, 8, 2, 300, 1000, backward=True)
    assert sp.plan_call(thd, hopper, t)[1].kernels[0] == "tiled_bwd_warpgroup_dq_stream"
    mha = C(128, 8, 8, 300, 1000, backward=True)
    assert sp.plan_call(mha, hopper, t)[1].path == "flash"
    plan = sp.plan_call(mha, hopper, dict(t, small_seq_flash_route=0))[1]
    assert plan.kernels[0] == "tiled_bwd_warpgroup_dq_stream"
    # the launch record: the kernel id, then D
    ints = sp.tiled_bwd_ints(C(64, 8, 1, 300, 1000, layout="bshd", backward=True), hopper, {})
    record = ints[2:2 + sp.LAUNCH_INTS]
    assert record == [sp.KERNEL_IDS["tiled_bwd_warpgroup_dq_stream"], 64, 0, 0, 0, 0, 0, 0]


# Backward kernels deleted because no benchmark row picked them on any arch (the wave dQ pass,
# the warpgroup dK / dV and staged dQ kernels without tile copies): no call may plan them.
DELETED_BWD = ("tiled_bwd_dq", "tiled_bwd_warpgroup", "tiled_bwd_warpgroup_dq")
# The warpgroup dK / dV instances the launcher compiles (KEYS, WITH_DQ, FUSED_DELTA,
# TRANSPOSED): histories of one key block with dQ and Delta fused; past one block the one-tile
# walk and the key-block items, Delta from pass 1 or the dQ kernel.
KEPT_WARPGROUP_DKDV = {(16, True, True, False), (64, True, True, False),
                       (64, True, False, True), (64, False, False, True)}
# Launches that compute Delta themselves (no Delta pass ahead of them).
_DELTA_FROM = ("tiled_bwd_warpgroup_dq_tma", "tiled_bwd_warpgroup_dq_stream")


def _check_kept_backward(call: sp.Call, device: sp.Device, plan: sp.Plan) -> None:
    """A backward plan names kept kernels only, each within what its launcher record accepts
    (tiled_bwd_launch.hip), with Delta from pass 1 or from a kernel that computes it, and a dQ
    for every row."""
    kernels, kv, rows = plan.kernels, call.max_seqlen_kv, call.rows
    assert kernels and not set(kernels) & set(DELETED_BWD), str(plan)
    assert set(kernels) <= set(sp.VARIANTS), str(plan)
    fused = any(launch.param("FUSED_DELTA") for launch in plan.launches)
    assert (kernels[0] == "tiled_bwd_delta") != (fused or kernels[0] in _DELTA_FROM), str(plan)
    for launch in plan.launches:
        k = launch.kernel
        if k.startswith("tiled_bwd_warpgroup"):
            assert device.warpgroup_mma and call.head_dim <= 128, str(plan)
        if k.endswith("_tma"):
            assert device.tile_copies and sp.WARPGROUP_ROWS % call.group == 0, str(plan)
        if k == "tiled_bwd_warpgroup_tma":
            key = tuple(launch.param(n) for n in ("KEYS", "WITH_DQ", "FUSED_DELTA", "TRANSPOSED"))
            assert key in KEPT_WARPGROUP_DKDV, str(plan)
            keys, with_dq, _, transposed = key
            assert kv <= (keys if with_dq and not transposed else sp.BWD_WARPGROUP_STREAM_MAX_KEYS)
            assert not (with_dq and transposed) or rows <= sp.WARPGROUP_ROWS, str(plan)
            assert with_dq or len(kernels) == 2, str(plan)   # beside a dQ kernel
        if k == "tiled_bwd_warpgroup_dq_tma":
            assert kv <= sp.BWD_WARPGROUP_MAX_KEYS, str(plan)
        if k == "tiled_bwd_warpgroup_two_tile":
            assert rows <= sp.BWD_TWO_TILE_ROWS, str(plan)
        if k == "tiled_bwd_stream":
            assert rows <= launch.param("ROWS"), str(plan)
        if k == "tiled_bwd_dkv" and launch.param("ONE_ROW_TILE"):
            assert rows <= sp.BWD_ROWS and (kv <= sp.BWD_KEYS or not launch.param("FUSED_DELTA"))
    if "tiled_bwd_dkv" in kernels and not plan.launches[-1].param("ONE_ROW_TILE"):
        # the general dK / dV pass writes dQ only where there is no dQ pass to run
        assert kv <= sp.BWD_KEYS or rows <= sp.BWD_ROWS, str(plan)
    if "tiled_bwd_dkv_block" in kernels:
        assert kernels[-1] == "tiled_bwd_dq_block", str(plan)


def test_every_backward_call_gets_a_kept_kernel():
    """Every call the tiled backward takes, on every arch (and on Hopper without tile copies:
    the launcher's fallback, tuning small_seq_tiled_warpgroup_tma 0, a GQA group not dividing a
    64-row tile), under the default tuning and each remaining backward knob, gets kept kernels:
    the calls the deleted variants served (unaligned tensors, a group of 3, few rows over many
    keys, tunings that forced them) now go to the wave / block kernels or a kept warpgroup
    instance, and the plan's fallback never needs tile copies."""
    tunings = [{}, {"small_seq_tiled_warpgroup_tma": 0}, {"small_seq_tiled_bwd_two_tile": 0},
               {"small_seq_tiled_bwd_dq_stream": 0}, {"small_seq_tiled_bwd_dq_stream": 2},
               {"small_seq_tiled_bwd_warpgroup": 2}, {"small_seq_tiled_bwd_warpgroup": 0},
               {"small_seq_tiled_bwd_row_tile": 0, "small_seq_tiled_bwd_stream": 0}]
    devices = [*sp.ARCHS.values(), dataclasses.replace(sp.ARCHS["sm_90a"], tile_copies=False)]
    for device in devices:
        for knobs in tunings:
            t = dict(sp.DEFAULT_TUNING, **knobs)
            for d in sp.TILED_HEAD_DIMS:
                for hq, hkv in ((8, 8), (8, 4), (12, 4), (8, 1)):
                    for q in (1, 2, 4, 5, 16, 17, 48, 64, 65, 128, 129, 300):
                        for kv in (1, 16, 17, 64, 65, 256, 257, 4096):
                            call = C(d, hq, hkv, q, kv, backward=True)
                            plan = sp.plan_tiled_backward(call, device, t)
                            _check_kept_backward(call, device, plan)
                            if any(k.endswith("_tma") for k in plan.kernels):
                                fallback = sp.plan_tiled_backward(
                                    call, dataclasses.replace(device, tile_copies=False), t)
                                assert not any(k.endswith("_tma") for k in fallback.kernels)
                                _check_kept_backward(call, device, fallback)
                            sp.tiled_bwd_ints(call, device, t)  # every launch encodes


def test_plan_is_pure_and_reads_no_device():
    """Same inputs, same plan; no torch device is touched (answers on a CPU-only machine)."""
    call = C(128, 8, 8, 128, 256, backward=True)
    a = sp.plan_call(call, sp.ARCHS["sm_90a"], sp.DEFAULT_TUNING)
    b = sp.plan_call(call, sp.ARCHS["sm_90a"], sp.DEFAULT_TUNING)
    assert a == b and str(a[0]) == str(b[0])


@pytest.mark.parametrize("arch", sorted(sp.ARCHS))
def test_cli_plan_answers_for_every_arch(arch):
    argv = [sys.executable, "-m", "rocm_attn", "plan", "--arch", arch, "--max-seqlen-q", "128",
            "--max-seqlen-kv", "256", "--head-dim", "128", "--heads", "8/2", "--dtype",
            "bfloat16", "--backward", "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    report = json.loads(out)
    assert report["arch"] == arch
    assert [p["direction"] for p in report["plans"]] == ["forward", "backward"]
    call = C(128, 8, 2, 128, 256, backward=True)
    want = sp.plan_call(call, sp.ARCHS[arch], sp.current_tuning())
    assert [[x["kernel"] for x in p["launches"]] for p in report["plans"]] == \
        [list(p.kernels) for p in want]
    text = subprocess.run(argv[:-1], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert text.startswith(f"{arch}: d 128, heads 8/2") and "backward:" in text


def test_cli_plan_rejects_bad_heads_and_tuning():
    base = [sys.executable, "-m", "rocm_attn", "plan", "--arch", "gfx942", "--max-seqlen-q",
            "4", "--max-seqlen-kv", "64", "--head-dim", "128"]
    bad = subprocess.run(base + ["--heads", "8/3"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "HQ a multiple of HKV" in bad.stderr
    bad = subprocess.run(base + ["--heads", "8/2", "--tuning", "nope=1"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "small-seq tuning name" in bad.stderr
    ok = subprocess.run(base + ["--heads", "8/2", "--tuning", "small_seq_tiled_block=0"],
                        capture_output=True, text=True, cwd=ROOT, check=True)
    assert "tiled_fwd_wave" in ok.stdout and "ROW_MAX=false" in ok.stdout
    ok = subprocess.run(base + ["--heads", "8/2", "--tuning", "small_seq_tiled_block=0",
                                "--max-logit"], capture_output=True, text=True, cwd=ROOT,
                        check=True)
    assert "tiled_fwd_wave" in ok.stdout and "ROW_MAX=true" in ok.stdout


def test_log_plan_at_info(monkeypatch, caplog):
    """--log-level INFO: each distinct plan of a call the kernels serve is logged once."""
    import logging

    import torch

    monkeypatch.setattr(sp, "device_of", lambda index=None: sp.ARCHS["gfx942"])
    log = logging.getLogger("rocm_attn")
    q, k = torch.empty(64, 8, 128, dtype=torch.bfloat16), torch.empty(64, 2, 128)
    with caplog.at_level(logging.INFO, logger="rocm_attn"):
        sp.log_plan(log, q, k, 8, 100, "thd", True, False, False, True)
    text = caplog.text
    assert "fused_attn_small_seq plan: gfx942: d 128, heads 8/2" in text
    assert "tiled_fwd_block(D=128, THREADS=256" in text and "tiled_bwd_delta" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rocm_attn"):
        sp.log_plan(log, q, k, 8, 101, "thd", True, False, False, True)
    assert caplog.text == ""


def test_forward_plan_ints():
    """What rocm_attn::small_seq_tiled_fwd receives: [launches, fallbacks, records of
    LAUNCH_INTS (kernel id, then LAUNCH_PARAMS)], and for a tile-copy kernel the plan of the
    same call without tile copies as the fallback."""
    hopper, gfx = sp.ARCHS["sm_90a"], sp.ARCHS["gfx942"]
    ints = sp.tiled_fwd_ints(C(128, 8, 2, 8, 100), gfx, {})
    assert ints == [1, 0, sp.KERNEL_IDS["tiled_fwd_block"], 128, 256, 0, 4, 0, 0, 0]
    ints = sp.tiled_fwd_ints(C(128, 8, 8, 128, 256, layout="bshd"), hopper, {})
    assert ints[:2] == [1, 1] and len(ints) == 2 + 2 * sp.LAUNCH_INTS
    # D, grid factor 1 and QUEUE (the work queue), ROW_MAX
    assert ints[2:10] == [sp.KERNEL_IDS["tiled_fwd_warpgroup_ws"], 128, 1, 1, 0, 0, 0, 0]
    # without tile copies: no warpgroup kernel of 64-key steps, the resident kernel
    assert ints[10:16] == [sp.KERNEL_IDS["tiled_fwd_resident"], 128, 4, 4, 0, 0]
    ints = sp.tiled_fwd_ints(C(64, 8, 8, 64, 64), hopper, {"small_seq_tiled_fwd_grid": 0})
    assert ints[2:10] == [sp.KERNEL_IDS["tiled_fwd_warpgroup_tma"], 64, 64, 1, 0, 0, 0, 0]
    ints = sp.tiled_fwd_ints(C(128, 8, 8, 128, 16), hopper, {})
    assert ints[2:10] == [sp.KERNEL_IDS["tiled_fwd_warpgroup"], 128, 4, 0, 0, 0, 0, 0]
    for case in CASES:
        arch, call = case[0], case[1]
        plan = sp.plan_call(call, sp.ARCHS[arch], sp.DEFAULT_TUNING)[0]
        if plan.path != "tiled":
            continue
        ints = sp.tiled_fwd_ints(call, sp.ARCHS[arch], {})
        assert ints[2] == sp.KERNEL_IDS[plan.launches[0].kernel], (arch, call)
        assert ints[1] == (1 if plan.launches[0].kernel.endswith(("_tma", "_ws")) else 0)


def test_one_query_plan_ints():
    """What rocm_attn::small_seq_fwd receives as plan and backward_plan (the backward op's
    plan): one record each, [1, 0, kernel id, D, KV, (PIPE,) grid_factor, zeros], the choices
    launch_impl.h made from the tuning before it took the plan."""
    gfx, hopper = sp.ARCHS["gfx942"], sp.ARCHS["sm_90a"]
    ids = sp.KERNEL_IDS
    fwd, bwd = sp.one_query_ints(C(128, 8, 8, 1, 16), gfx, {})
    assert fwd == (1, 0, ids["fwd"], 128, 16, 1, 4, 0, 0, 0)        # group 1: pipelined
    assert bwd == (1, 0, ids["bwd"], 128, 16, 1, 4, 0, 0, 0)
    fwd, bwd = sp.one_query_ints(C(512, 8, 8, 1, 16), hopper, {"small_seq_bwd_grid": 0})
    assert fwd == (1, 0, ids["fwd"], 512, 16, 0, 4, 0, 0, 0)        # not pipelinable
    assert bwd == (1, 0, ids["bwd"], 512, 16, 0, 0, 0, 0, 0)        # grid factor 0
    fwd, bwd = sp.one_query_ints(C(64, 8, 2, 1, 5), gfx, {})
    assert fwd == (1, 0, ids["fwd_mma"], 64, 8, 4, 0, 0, 0, 0)      # GQA group 4, bucket 8
    assert bwd == (1, 0, ids["bwd_mma"], 64, 8, 4, 0, 0, 0, 0)
    fwd, bwd = sp.one_query_ints(C(256, 32, 2, 1, 3), gfx, {"small_seq_fwd_grid": 2})
    assert fwd == (1, 0, ids["fwd_mma"], 256, 4, 2, 0, 0, 0, 0)
    assert bwd == (1, 0, ids["bwd_mma_wide"], 256, 4, 4, 0, 0, 0, 0)  # group 16 > 8
    # small_seq_mma / small_seq_pipe bit masks: GQA on the general kernels keeps the plain loop
    fwd, bwd = sp.one_query_ints(C(64, 8, 2, 1, 5), gfx, {"small_seq_mma": 2})
    assert fwd[2:6] == (ids["fwd"], 64, 8, 0) and bwd[2] == ids["bwd_mma"]
    fwd, bwd = sp.one_query_ints(C(128, 8, 8, 1, 16), gfx, {"small_seq_pipe": 1})
    assert fwd[5] == 1 and bwd[5] == 0
    # every record is what decode reads: [launches, fallbacks, LAUNCH_INTS per launch]
    for call in (C(d, hq, 2, 1, kv) for d in sp.ONE_QUERY_HEAD_DIMS for hq in (2, 8, 16, 18, 32)
                 for kv in (1, 4, 5, 8, 9, 16)):
        for arch in sp.ARCHS.values():
            for ints, plan in zip(sp.one_query_ints(call, arch, {}),
                                  (sp.plan_one_query(call, arch, sp.DEFAULT_TUNING, s)
                                   for s in ("forward", "backward"))):
                assert len(ints) == 2 + sp.LAUNCH_INTS and ints[:2] == (1, 0)
                launch = plan.launches[0]
                assert ints[2] == ids[launch.kernel]
                assert ints[3:5] == (call.head_dim, sp.kv_bucket(call.max_seqlen_kv))
                assert ints[-1] == 0


def test_one_query_plans_of_a_process(monkeypatch):
    """one_query_plans: the plans of a call on q's device with this process's tuning (no GPU:
    the gfx942 table), empty for a call the one-query kernels do not take (the op's own checks
    refuse it first); ops._plans caches them per shape and tuning generation."""
    import torch

    from rocm_attn import ops

    q, k = torch.zeros(3, 8, 128), torch.zeros(3, 2, 128)
    expected = sp.one_query_ints(C(128, 8, 2, 1, 5), sp.ARCHS["gfx942"], sp.current_tuning())
    assert sp.one_query_plans(q, k, 5) == expected
    assert ops._plans(q, k, 5) == expected
    for bad_q, bad_k, kv in [(q, k, 17), (q, k, 0), (torch.zeros(3, 8, 96), k, 5),
                             (q, torch.zeros(3, 3, 128), 5), (torch.zeros(3, 8, 0), k, 5)]:
        assert sp.one_query_plans(bad_q, bad_k, kv) == ((), ())
        assert ops._plans(bad_q, bad_k, kv) == ((), ())
    assert ops._plans(q, torch.zeros(3), 5) == ((), ())  # k without a heads dim
    # under torch.compile the plans are a constant of the trace (no graph break)
    compiled = torch.compile(lambda q, k: q * ops._plans(q, k, 5)[1][2], fullgraph=True,
                             backend="eager")
    assert torch.equal(compiled(q, k), q * sp.KERNEL_IDS["bwd_mma"])
    calls = []
    monkeypatch.setattr(sp, "one_query_plans", lambda *a: calls.append(a) or ((1,), (2,)))
    monkeypatch.setattr(ops, "_one_query_plans", {})
    assert ops._plans(q, k, 7) == ((1,), (2,)) and ops._plans(q, k, 7) == ((1,), (2,))
    assert len(calls) == 1
    monkeypatch.setattr(ops.tuning, "generation", lambda: -1)  # a tuning value changed
    ops._plans(q, k, 7)
    assert len(calls) == 2


def test_plans_of_bad_calls_leave_the_refusal_to_the_op():
    """Calls that go to the op before the Python checks (small_seq._kernels_unchecked: a shape
    the kernels already served) plan first: every bad input of the CPU suite whose bound is an
    int plans without raising (empty plans where the one-query kernels take no such call), so
    the op's RuntimeError, which sends the call back to the checks naming the argument, is what
    the caller sees."""
    import torch
    from test_small_seq import BSHD_BAD, THD_BAD, _good_bshd_args, _good_thd_args

    from rocm_attn import ops

    for good, bad in ((_good_thd_args, THD_BAD), (_good_bshd_args, BSHD_BAD)):
        for name, change, _ in bad:
            args = dict(good(), **change)
            q, k, kv = args["q"], args["k"], args["max_seqlen_kv"]
            if type(kv) is not int or not all(isinstance(t, torch.Tensor) for t in (q, k)):
                continue  # _kernels_unchecked does not take these to the op
            plan, backward_plan = ops._plans(q, k, kv)
            assert len(plan) in (0, 2 + sp.LAUNCH_INTS), name


def test_max_logit_takes_the_row_max_twin_of_the_same_kernel():
    """A tiled forward that writes each row's maximum logit (``max_logit``) runs the kernel the
    same call without it runs, as its ROW_MAX instance wherever a history may take more than
    one key step (lazy rescaling kept, each row's exact maximum carried apart), as the plain
    instance where it is one step (the one-tile wave instance, 16-key warpgroup steps: they never
    rescale); the record carries the flag last, where the launcher reads it."""
    seen = set()
    for arch, device in sp.ARCHS.items():
        for d, (hq, hkv), q, kv in itertools.product(
                sp.TILED_HEAD_DIMS, [(8, 8), (8, 2)], [1, 16, 128, 512], [5, 16, 100, 256, 4096]):
            plain = sp.plan_tiled_forward(C(d, hq, hkv, q, kv), device, sp.DEFAULT_TUNING)
            rows = sp.plan_tiled_forward(C(d, hq, hkv, q, kv, max_logit=True), device,
                                         sp.DEFAULT_TUNING)
            (a,), (b,) = plain.launches, rows.launches
            assert a.kernel == b.kernel, (arch, str(plain), str(rows))
            pa = {k: v for k, v in a.params if k != "ROW_MAX"}
            pb = {k: v for k, v in b.params if k != "ROW_MAX"}
            assert pa == pb, (arch, str(plain), str(rows))
            if "ROW_MAX" not in sp.LAUNCH_PARAMS[a.kernel]:
                assert a.kernel == "tiled_fwd_warpgroup" and sp.warpgroup_step_keys(kv) == 16
                continue
            assert a.param("ROW_MAX") is False, str(plain)
            one_step = b.param("ONE_TILE") is True or b.param("KEYS") == 16
            assert b.param("ROW_MAX") is (not one_step), (arch, str(rows))
            assert sp.LAUNCH_PARAMS[b.kernel][-1] == "ROW_MAX"
            record = sp.encode(rows)[2:]
            assert record[len(sp.LAUNCH_PARAMS[b.kernel])] == int(not one_step)
            seen.add((b.kernel, b.param("ROW_MAX")))
    assert {k for k, row_max in seen if row_max} == {
        "tiled_fwd_wave", "tiled_fwd_block", "tiled_fwd_resident", "tiled_fwd_warpgroup_tma",
        "tiled_fwd_warpgroup_ws"}, seen
