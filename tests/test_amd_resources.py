"""AMD resource reports of tools/check_kernels.py: the assembly parser, the occupancy rule, the
generated docs table, and (where the toolchain is installed) the ROCm LLVM compile route."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_kernels  # noqa: E402
import rocm_llvm_codegen  # noqa: E402

needs_clang = pytest.mark.skipif(shutil.which("clang++-19") is None, reason="needs clang++-19")
needs_rocm_llvm = pytest.mark.skipif(not rocm_llvm_codegen.available(),
                                     reason="needs the rocm-llvm-python wheel")


def _kernel_asm(name: str, n: int, vgprs: int, agprs: int, sgprs: int, scratch: int, lds: int,
                occ: int) -> str:
    """One kernel's tail as ROCm LLVM writes it with verbose assembly (shape of its output)."""
    total = (-(-vgprs // 4) * 4 + agprs) if agprs else vgprs
    return f"""\t.end_amdhsa_kernel
\t.text
.Lfunc_end{n}:
\t.size\t{name}, .Lfunc_end{n}-{name}
                                        ; -- End function
\t.set {name}.num_vgpr, {vgprs}
\t.set {name}.num_agpr, {agprs}
\t.set {name}.numbered_sgpr, {sgprs}
\t.set {name}.private_seg_size, {scratch}
\t.section\t.AMDGPU.csdata,"",@progbits
; Kernel info:
; codeLenInByte = 9744
; TotalNumSgprs: {sgprs + 6}
; NumVgprs: {vgprs}
; NumAgprs: {agprs}
; TotalNumVgprs: {total}
; ScratchSize: {scratch}
; MemoryBound: 0
; LDSByteSize: {lds} bytes/workgroup (compile time only)
; SGPRBlocks: 13
; NumSGPRsForWavesPerEU: {sgprs + 6}
; NumVGPRsForWavesPerEU: {total}
; AccumOffset: {-(-vgprs // 4) * 4}
; Occupancy: {occ}
; WaveLimiterHint : 1
"""


def _metadata(entries: list[dict]) -> str:
    lines = ["\t.amdgpu_metadata", "---", "amdhsa.kernels:"]
    for e in entries:
        lines += ["  - .agpr_count:     0", "    .args:",
                  "      - .address_space:  global", "        .offset:         0",
                  "        .size:           8", "        .value_kind:     global_buffer"]
        for key in sorted(e):  # LLVM writes the keys in sorted order, .name among them
            lines.append(f"    {key}: {e[key]}")
    lines += ["amdhsa.target:   amdgcn-amd-amdhsa--gfx942", "...", "\t.end_amdgpu_metadata", ""]
    return "\n".join(lines)


def test_parse_amdgpu_asm_reads_comments_and_metadata():
    asm = (_kernel_asm("_Z1av", 0, vgprs=112, agprs=4, sgprs=100, scratch=0, lds=0, occ=4)
           + "\t.text\n.Lfunc_begin1:\n"
           + _kernel_asm("_Z1bv", 1, vgprs=255, agprs=0, sgprs=40, scratch=48, lds=40960, occ=1)
           + _metadata([
               {".name": "_Z1av", ".max_flat_workgroup_size": 128, ".sgpr_spill_count": 72,
                ".vgpr_spill_count": 0, ".wavefront_size": 64, ".group_segment_fixed_size": 0,
                ".private_segment_fixed_size": 0},
               {".name": "_Z1bv", ".max_flat_workgroup_size": 256, ".sgpr_spill_count": 0,
                ".vgpr_spill_count": 12, ".wavefront_size": 64,
                ".group_segment_fixed_size": 40960, ".private_segment_fixed_size": 48},
           ]))
    a, b = check_kernels.parse_amdgpu_asm(asm, "gfx942")
    assert a["name"] == "_Z1av" and b["name"] == "_Z1bv"
    assert (a["vgprs"], a["agprs"], a["total_vgprs"], a["sgprs"]) == (112, 4, 116, 100)
    assert (a["block"], a["occupancy"], a["sgpr_spill"], a["spills"]) == (128, 4, 72, 0)
    assert (a["waves"], a["limit"]) == (4, "VGPRs")  # 512 // 120
    # b spills 12 VGPRs into 48 bytes of scratch; its 40 KiB of LDS fit once per 64 KiB CU.
    assert (b["vgpr_spill"], b["scratch"], b["lds"], b["spills"]) == (12, 48, 40960, 60)
    assert (b["waves"], b["limit"]) == (1, "LDS")  # VGPRs alone would allow 512 // 256 = 2


def test_parse_amdgpu_asm_skips_device_functions():
    # A non-kernel function has a .size line but no "; Kernel info:" block.
    asm = ("\t.size\t_Z6helperv, .Lfunc_end0-_Z6helperv\n; -- End function\n"
           + _kernel_asm("_Z1av", 1, 64, 0, 30, 0, 0, 8) + _metadata([{".name": "_Z1av"}]))
    [k] = check_kernels.parse_amdgpu_asm(asm, "gfx950")
    assert k["name"] == "_Z1av" and "waves" not in k  # no block bound in its metadata


@pytest.mark.parametrize("arch,args,expected", [
    ("gfx942", (116, 106, 0, 128), (4, "VGPRs")),      # 512 // 120
    ("gfx942", (64, 40, 0, 256), (8, "none")),        # 512 // 64 = 8, the most a SIMD holds
    ("gfx942", (65, 40, 0, 256), (7, "VGPRs")),       # 72 per wave: 512 // 72
    ("gfx942", (32, 107, 0, 256), (7, "SGPRs")),      # more than 100 SGPRs: 7
    ("gfx942", (32, 40, 40960, 256), (1, "LDS")),     # one 4-wave block of 40 KiB per CU
    ("gfx950", (32, 40, 40960, 256), (4, "LDS")),     # 160 KiB: four such blocks
    ("gfx950", (32, 40, 40960, 64), (1, "LDS")),      # four one-wave blocks over four SIMDs
    ("gfx942", (32, 40, 70000, 64), (1, "LDS")),      # more LDS than a CU has: worst case 1
    ("gfx90a", (256, 40, 0, 1024), (2, "VGPRs")),     # 512 // 256
    ("gfx942", (512, 40, 0, 64), (1, "VGPRs")),
])
def test_occupancy_rule(arch, args, expected):
    assert check_kernels.occupancy(arch, *args) == expected


def test_doc_table_rows_per_kernel_and_arch(tmp_path):
    k = {"name": "_ZN9small_seq20small_seq_fwd_kernelI7ra_bf16Li64ELi4ELb1EEEv14SmallSeqParams",
         "vgprs": 88, "agprs": 0, "sgprs": 100, "lds": 0, "scratch": 0, "occupancy": 5,
         "block": 128, "waves": 5, "limit": "VGPRs", "spills": 0}
    empty = {"name": "_Z5emptyv", "vgprs": 0, "agprs": 0, "sgprs": 4, "occupancy": 8}
    results = [check_kernels.Result("gfx950", "build/gen/small_seq_fwd_bf16_d64_kv4.hip", True,
                                    kernels=[k, empty]),
               check_kernels.Result("sm_90a", "x.cu", True, kernels=[{"name": "_Z1xv"}])]
    out = tmp_path / "res.md"
    check_kernels.write_doc(out, results, ["sm_90a", "gfx950"])
    text = out.read_text()
    assert "## gfx950" in text and "## sm_90a" not in text
    row = next(line for line in text.splitlines() if "small_seq_fwd_kernel" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    if shutil.which("c++filt"):
        assert cells[1] == "`small_seq_fwd_kernel<ra_bf16, 64, 4, true>`"
    assert cells[0] == "small_seq_fwd_bf16_d64_kv4"
    assert cells[2:] == ["128", "88", "0", "100", "0", "0", "5", "VGPRs"]
    assert "waves/SIMD: 5: 1. Not listed: 1 instances compiled empty" in text
    assert "_Z5emptyv" not in text and "| empty" not in text


def test_demangled_names_keep_template_arguments():
    names = ["_ZN3thd21copy_wide_rows_kernelIL9ThdRowMap0EEEv13ThdCopyParamsili", "_Z1av"]
    out = check_kernels.demangle(names)
    assert out["_Z1av"] == "a"
    if shutil.which("c++filt"):
        assert out[names[0]] == "copy_wide_rows_kernel<(ThdRowMap)0>"
    assert check_kernels._drop_parameters("ns::f<(E)0>(P, int (*)(int))") == "ns::f<(E)0>"


def test_docs_resources_table_is_linked_and_generated():
    doc = ROOT / "docs/kernels_resources.md"
    text = doc.read_text()
    assert text.startswith(check_kernels.DOC_HEADER)
    for arch in ("gfx90a", "gfx942", "gfx950"):
        assert f"\n## {arch}\n" in text
    assert "kernels_resources.md" in (ROOT / "docs/kernels.md").read_text()


@needs_clang
def test_gfx950_front_end_sees_matrix_units(tmp_path):
    """clang-19 knows no gfx950, so check_kernels runs its front end as gfx942 with gfx950's
    macros; mma.h must then enable the MFMA path (gfx950 has gfx942's 16x16x16 MFMAs)."""
    src = tmp_path / "probe.hip"
    src.write_text('#include "common/compat.h"\nint has_mma = RA_HAS_MMA;\n'
                   "#ifdef __gfx942__\nint still_gfx942;\n#endif\n")
    cmd = ["clang++-19", "-x", "hip", "--offload-arch=gfx942", "--cuda-device-only", "-nogpulib",
           "--rocm-path=/usr", "-std=c++17", "-I", str(ROOT / "hip_src"), "-E",
           *check_kernels.FRONT_END_MACROS["gfx950"], str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode and "hip_runtime" in proc.stderr:
        pytest.skip("HIP headers missing")
    assert proc.returncode == 0, proc.stderr
    assert "int has_mma = 1;" in proc.stdout and "still_gfx942" not in proc.stdout


@needs_clang
@needs_rocm_llvm
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_rocm_llvm_route_reports_resources_and_scratch(tmp_path, arch):
    """A small kernel through the whole route: a dynamically indexed private array lands in
    scratch, which the zero-spill gate counts."""
    src = tmp_path / "probe.hip"
    src.write_text("#include <hip/hip_runtime.h>\n"
                   "__global__ void __launch_bounds__(256) probe(float* x, int i) {\n"
                   "  float a[64];\n"
                   "  for (int j = 0; j < 64; ++j) a[j] = x[j * blockDim.x + threadIdx.x];\n"
                   "  x[threadIdx.x] = __expf(a[i & 63]);\n"
                   "}\n")
    r = check_kernels.compile_one(arch, src, ROOT / "hip_src", tmp_path / "out")
    assert r.ok, r.log
    [k] = r.kernels
    assert k["name"] == "_Z5probePfi" and k["block"] == 256 and k["scratch"] >= 256
    assert k["spills"] >= 256 and k["occupancy"] == k["waves"]
    asm = (tmp_path / "out" / "probe.s").read_text()
    assert f'.amdgcn_target "amdgcn-amd-amdhsa--{arch}' in asm
