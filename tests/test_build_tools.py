"""Build tooling: kernel variant lists agree, resource-report parsers, CPU build info."""

from __future__ import annotations

import re
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_kernels  # noqa: E402
import generate_kernels  # noqa: E402


def test_generated_variants_match_dispatch_switches():
    text = (ROOT / "hip_src/small_seq/dispatch.h").read_text()
    head_dims = {int(x) for x in re.findall(r"constexpr int D = (\d+)", text)}
    buckets = {int(x) for x in re.findall(r"constexpr int KV = (\d+)", text)}
    assert head_dims == set(generate_kernels.HEAD_DIMS)
    assert buckets == set(generate_kernels.KV_BUCKETS)
    py = (ROOT / "rocm_attn/small_seq.py").read_text()
    assert f"KERNEL_HEAD_DIMS = {tuple(sorted(head_dims))}" in py
    assert max(buckets) == 16 and "MAX_SEQLEN_KV = 16" in py


def test_generate_writes_one_file_per_variant_and_is_stable(tmp_path):
    paths = generate_kernels.generate(tmp_path)
    assert len(paths) - 1 == len(generate_kernels.small_seq_variants()) == 2 * 2 * 4 * 3
    assert paths[-1].name == generate_kernels.PLAN_CHECK
    mtimes = [p.stat().st_mtime_ns for p in paths]
    again = generate_kernels.generate(tmp_path)
    assert again == paths and [p.stat().st_mtime_ns for p in paths] == mtimes
    text = (tmp_path / "small_seq_bwd_fp16_d256_kv8.hip").read_text()
    assert "run_bwd<ra_fp16, 256, 8>" in text


def test_parse_ptxas_reports_registers_and_spills():
    log = """ptxas info    : Compiling entry function '_Z3fooi' for 'sm_90'
ptxas info    : Function properties for _Z3fooi
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 0 barriers
"""
    [k] = check_kernels.parse_ptxas(log)
    assert k == {"name": "_Z3fooi", "stack": 16, "spills": 20, "registers": 128}


def test_parse_amd_resources_counts_vgpr_spills_not_sgpr_spills():
    fields = {"SGPRs": 40, "VGPRs": 113, "AGPRs": 0, "ScratchSize [bytes/lane]": 0,
              "Occupancy [waves/SIMD]": 4, "SGPRs Spill": 3, "VGPRs Spill": 0,
              "LDS Size [bytes/block]": 0}
    lines = ["a.hip:1:1: remark: Function Name: kern [-Rpass-analysis=kernel-resource-usage]"]
    lines += [f"a.hip:1:1: remark:     {k}: {v} [-Rpass-analysis=kernel-resource-usage]" for k, v in fields.items()]
    [k] = check_kernels.parse_amd_resources("\n".join(lines))
    assert k["vgprs"] == 113 and k["occupancy"] == 4 and k["sgpr_spill"] == 3 and k["spills"] == 0


def test_build_info_on_cpu_install():
    import rocm_attn

    info = rocm_attn.build_info()
    assert set(info) >= {"backend", "archs", "kernels", "extension_loaded", "torch"}
    if not info["extension_loaded"]:
        assert info["extension_error"]
