"""THD kernels (hip_src/thd) executed on the CPU emulation (tests/helpers/emu.py) at 64 and
32 lanes, through rocm_attn.thd's own kernel wrappers: the GPU tests of tests/test_thd_gpu.py
run unchanged on CPU tensors, with torch.ops.rocm_attn replaced by helpers.emu.EmuThdOps (a
line-by-line port of the THD ops of hip_src/bindings/thd_*.cpp onto the emulated launchers).

Same bounds as on the GPU: copies and grad corrections bitwise equal to the torch path, merges
within one unit in the last place; every call must take the kernel path (a fallback to the
torch path fails), and fresh outputs start as 0xFF bytes (NaN), so an unwritten element fails.
The grids are smaller than the GPU tests' (2-core CI); the CUDA graph, torch.compile and 50k
sequence tests stay GPU-only.
"""

from __future__ import annotations

import contextlib

import re

import pytest
import torch

import rocm_attn
import test_thd_gpu as G
from helpers import emu
from rocm_attn.thd import _dispatch, _kernels
from test_thd_gpu import _kernels_only  # noqa: F401  (autouse: a fallback to torch fails)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# NARROW rows take the row-group kernels; WIDE the wide-row kernels at 32 lanes only (40
# vectors); WIDE64 (128 vectors of 16 bytes for bf16) at 64 lanes as well.
NARROW, WIDE, WIDE64 = (5, 24), (8, 40), (16, 64)




@pytest.fixture
def dev(lib, monkeypatch):
    """The CPU as the 'device': kernel wrappers on, ops emulated, CPU allocator poisoning."""
    monkeypatch.setattr(torch.ops, "rocm_attn", emu.EmuThdOps(lib), raising=False)
    monkeypatch.setattr(rocm_attn._ext, "kernels_usable", lambda t: True)
    for name, fn in _kernels.KERNEL_IMPLS.items():
        monkeypatch.setitem(_dispatch.KERNELS, name, fn)
    monkeypatch.setattr(G, "poison_allocator", lambda device: None)  # EmuThdOps poisons
    lib.stats(reset=True)
    yield torch.device("cpu")
    assert lib.stats()["inactive_reads"] == 0, "a lane read a value from an exited lane"


@pytest.mark.parametrize("row", [NARROW, WIDE, WIDE64], ids=["narrow", "wide", "wide64"])
@pytest.mark.parametrize("layout,dtype", [("contiguous", torch.bfloat16),
                                          ("sliced", torch.float16),
                                          ("sliced8", torch.bfloat16),
                                          ("strided", torch.float32)])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_partition_reorder_read_half(dev, cp, dtype, layout, row):
    G.test_partition_reorder_read_half(dev, cp, dtype, layout, row)


@pytest.mark.parametrize("cp", [2, 8])
def test_lse_layout_token_dim_last(dev, cp):
    G.test_lse_layout_token_dim_last(dev, cp)


@pytest.mark.parametrize("shape,dtype", [((3, 7), torch.bfloat16), ((2, 2), torch.float16),
                                         ((5,), torch.float32), ((1, 4, 1), torch.float64),
                                         ((), torch.float32), ((16, 128), torch.bfloat16)])
def test_odd_row_sizes(dev, shape, dtype):
    G.test_odd_row_sizes(dev, shape, dtype)


def test_misaligned_base_pointer(dev):
    G.test_misaligned_base_pointer(dev)


@pytest.mark.parametrize("row", [(3, 40), WIDE, WIDE64], ids=["narrow", "wide", "wide64"])
@pytest.mark.parametrize("pads,layout,dtype", [("both", "contiguous", torch.bfloat16),
                                               ("dst", "strided", torch.float16),
                                               ("src", "contiguous", torch.float32),
                                               ("packed", "strided", torch.bfloat16)])
@pytest.mark.parametrize("fill", [None, 0.0, float("-inf")])
def test_copy_valid_tokens(dev, fill, pads, dtype, layout, row):
    G.test_copy_valid_tokens(dev, fill, pads, dtype, layout, row)


@pytest.mark.parametrize("row", [(3, 40), WIDE], ids=["narrow", "wide"])
@pytest.mark.parametrize("fill", [None, 0.0])
def test_copy_writes_stay_inside_dst(dev, fill, row):
    G.test_copy_writes_stay_inside_dst(dev, fill, row)


def test_outer_dims_before_the_token_dim(dev):
    G.test_outer_dims_before_the_token_dim(dev, torch.bfloat16)


@pytest.mark.parametrize("cp", [1, 4])
def test_pad_for_cp(dev, cp):
    G.test_pad_for_cp(dev, cp, torch.bfloat16)


@pytest.mark.parametrize("h", [3, 8])
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "second_half"])
@pytest.mark.parametrize("out_dtype,step_dtype", [(torch.bfloat16, torch.bfloat16),
                                                  (torch.float32, torch.float16)],
                         ids=["bf16", "fp32acc_fp16"])
@pytest.mark.parametrize("d,layout", [(64, "contiguous"), (40, "sliced")])
def test_merge_partial(dev, d, layout, out_dtype, step_dtype, half, inplace, h):
    G.test_merge_partial(dev, d, layout, out_dtype, step_dtype, half, inplace, h)


@pytest.mark.parametrize("h", [3, 16])
@pytest.mark.parametrize("half", [False, True], ids=["full", "second_half"])
def test_merge_writes_stay_inside_out(dev, half, h):
    G.test_merge_writes_stay_inside_out(dev, half, h, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 13])
def test_merge_rows(dev, d):
    G.test_merge_rows(dev, d, torch.float32, torch.bfloat16)
    G.test_merge_rows_with_step_rows(dev, d, torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 13])
def test_add_rows(dev, d):
    G.test_add_rows(dev, d, torch.float32, torch.bfloat16)


@pytest.mark.parametrize("h", [4, 12])
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "second_half"])
def test_lse_and_out_correction(dev, half, inplace, h):
    G.test_lse_and_out_correction(dev, half, inplace, h)


def test_merge_identity_and_two_pass(dev):
    G.test_merge_identity_and_two_pass(dev)


@pytest.mark.parametrize("row", [(4, 24), WIDE, WIDE64], ids=["narrow", "wide", "wide64"])
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("ops,step", [(("none", "add"), "half"), (("copy", "none"), "half"),
                                      (("add", "add"), "full"), (("copy", "add"), "full"),
                                      (("none", "copy"), "full")],
                         ids=["none-add-half", "copy-none-half", "add-add", "copy-add",
                              "none-copy"])
@pytest.mark.parametrize("gdtype,sdtype", [(torch.bfloat16, torch.bfloat16),
                                           (torch.float32, torch.bfloat16)], ids=["bf16", "mixed"])
def test_grad_correction(dev, gdtype, sdtype, ops, step, inplace, row):
    G.test_grad_correction(dev, gdtype, sdtype, ops, step, inplace, row)


@pytest.mark.parametrize("ops", [("none", "add"), ("add", "add")], ids=lambda o: "-".join(o))
@pytest.mark.parametrize("row", [(4, 24), WIDE, WIDE64], ids=["narrow", "wide", "wide64"])
def test_grad_writes_stay_inside_grad(dev, ops, row):
    G.test_grad_writes_stay_inside_grad(dev, ops, row)


# b = 100 and 200: the chunked wave searches (up to 2 x wave and 4 x wave sequences); b = 300:
# past them at 64 lanes too (binary search)
@pytest.mark.parametrize("b,row", [(100, (8, 40)), (100, (144, 64)), (200, (8, 40)),
                                   (300, (8, 40))], ids=["b100", "b100-18pieces", "b200", "b300"])
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "rowgroup"])
def test_wide_rows_many_sequences(dev, wide, b, row):
    with contextlib.ExitStack() as stack:
        G.test_wide_rows_many_sequences(dev, wide, b, row,
                                        lambda **v: stack.enter_context(emu.tuning(**v)))


def test_schedule_order_does_not_matter(dev, monkeypatch):
    """Blocks, waves and lanes in reverse order (RA_EMU_REVERSE=1): the same bitwise checks."""
    monkeypatch.setenv("RA_EMU_REVERSE", "1")
    G.test_partition_reorder_read_half(dev, 4, torch.bfloat16, "sliced8", WIDE64)
    G.test_merge_partial(dev, 64, "contiguous", torch.bfloat16, torch.bfloat16, True, False, 8)
    G.test_grad_correction(dev, torch.bfloat16, torch.bfloat16, ("none", "add"), "half", False,
                           WIDE64)


def _kernel_families() -> set:
    """Every __global__ function under hip_src/ (the kernel families)."""
    names = set()
    for path in emu.HIP_SRC.rglob("*"):
        if path.suffix not in (".h", ".hip"):
            continue
        text = path.read_text()
        for m in re.finditer(r"__global__\s+void\s+", text):
            rest = text[m.end():]
            while True:  # skip launch-bounds macros with their (nested) parentheses
                word = re.match(r"(\w+)\s*\(", rest)
                if word is None or word.group(1) not in ("__launch_bounds__",
                                                         "RA_LAUNCH_BOUNDS_MIN_BLOCKS"):
                    break
                depth, i = 0, word.end() - 1
                for i in range(word.end() - 1, len(rest)):
                    depth += {"(": 1, ")": -1}.get(rest[i], 0)
                    if depth == 0:
                        break
                rest = rest[i + 1:].lstrip()
            names.add(word.group(1))
    return names


# Kernels whose body exists only in NVIDIA arch-specific code, and why: the emulation runs the
# HIP sources with AMD's wave semantics and has no model of these units.
NVIDIA_ONLY_KERNELS = {
    "small_seq_tiled_fwd_warpgroup_kernel":
        "Hopper warpgroup MMA (sm_90a); tests/test_small_seq_tiled_gpu.py runs it on a GPU",
    "small_seq_tiled_fwd_warpgroup_tma_kernel":
        "Hopper warpgroup MMA and tensor tile copies (CUDA sm_90a); tests/test_small_seq_tiled_gpu.py runs it on a GPU",
    "small_seq_tiled_fwd_warpgroup_ws_kernel":
        "Hopper warpgroup MMA, tensor tile copies and setmaxnreg (CUDA sm_90a); tests/test_small_seq_tiled_gpu.py runs it on a GPU",
    "small_seq_tiled_bwd_warpgroup_tma_kernel":
        "Hopper warpgroup MMA and tensor tile copies (CUDA sm_90a); tests/test_small_seq_tiled_bwd_gpu.py runs it on a GPU",
    "small_seq_tiled_bwd_warpgroup_two_tile_kernel":
        "Hopper warpgroup MMA (sm_90a); tests/test_small_seq_tiled_bwd_gpu.py runs it on a GPU",
    "small_seq_tiled_bwd_warpgroup_dq_tma_kernel":
        "Hopper warpgroup MMA and tensor tile copies (CUDA sm_90a); tests/test_small_seq_tiled_bwd_gpu.py runs it on a GPU",
    "small_seq_tiled_bwd_warpgroup_dq_stream_kernel":
        "Hopper warpgroup MMA (sm_90a); tests/test_small_seq_tiled_bwd_long_gpu.py runs it on a GPU",
}


def test_nvidia_only_kernels_exist():
    """The exemptions name kernels that exist (a renamed kernel does not stay exempt)."""
    assert set(NVIDIA_ONLY_KERNELS) <= _kernel_families()


def test_every_kernel_ran(request):
    """After the whole emulation suite: every kernel family of hip_src/ was executed, at 64 and
    at 32 lanes."""
    files = {item.path.name for item in request.session.items}
    selected = not (request.config.option.keyword or request.config.option.markexpr)
    if not selected or not {"test_emu_common.py", "test_emu_small_seq.py",
                            "test_emu_thd.py", "test_emu_small_seq_tiled.py",
                            "test_emu_small_seq_tiled_bwd.py",
                            "test_emu_small_seq_flash_contract.py"} <= files:
        pytest.skip("needs the whole emulation suite in this session")
    families = _kernel_families()
    assert len(families) >= 13, families
    for name in ("w64", "w32"):
        lib = emu.emu_or_skip(name)
        # the tiled kernels are built into their own library per wave width (tiled_w64 / _w32)
        tiled = emu.emu_or_skip("tiled_" + name)
        ran = {re.match(r"(?:void )?(?:\w+::)*(\w+)", k).group(1)
               for k in lib.kernels_run() + tiled.kernels_run()}
        # at 32 lanes the MMA kernels run their general bodies; the NVIDIA-only kernels have
        # no emulated body (their GPU tests cover them)
        want = families - set(NVIDIA_ONLY_KERNELS)
        assert want <= ran, f"wave {lib.wave}: kernels never run: {sorted(want - ran)}"
        for loop in ("small_seq_fwd_kernel", "small_seq_bwd_kernel"):  # pipelined and plain
            for pipe in ("true", "false"):
                assert any(re.search(rf"{loop}<.*, {pipe}>", k) for k in lib.kernels_run()), \
                    f"wave {lib.wave}: {loop} with PIPE={pipe} never ran"
