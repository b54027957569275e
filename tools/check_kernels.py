"""Compile every kernel source for every target, with no GPU, and report resources.

Targets:
  sm_90a  hipified sources (tools/hipify.py) through nvcc -gencode=arch=compute_90a,code=sm_90a
          (the build's default: the Hopper warpgroup-MMA kernels exist only there)
  sm_100  the same through nvcc for sm_100 (B200/GB200; nvcc >= 12.8), not in the default set
  gfx90a  HIP sources through Debian's clang-19 HIP front end, full compile, with
          -Rpass-analysis=kernel-resource-usage (VGPRs, SGPRs, scratch, occupancy, spills)
  gfx942, gfx950
          HIP sources through ROCm's own LLVM (the rocm-llvm-python wheel, see
          tools/rocm_llvm_codegen.py): Debian's clang-19 front end writes unoptimised device
          bitcode with the device libraries linked, ROCm LLVM runs the O3 pipeline and code
          generation for the target, and the assembly's resource comments and code object
          metadata give VGPRs, AGPRs, SGPRs, LDS, scratch, spills and waves per SIMD.
          clang-19 knows no gfx950: its front end runs as gfx942 with the gfx950 macros
          (__gfx950__, __amdgcn_processor__) in place of gfx942's, the same ISA family to
          every header here; the device libraries' ISA version is gfx940's (Debian's newest).
Warnings are errors. Spills to scratch on AMD targets fail the check unless --allow-spills;
nvcc's own register heuristics sometimes trade a few bytes of local memory for occupancy on
sm_90a, so spills there are reported, not fatal. --install apt-installs clang-19 and the HIP
headers and pip-installs rocm-llvm-python when missing.

Usage: python tools/check_kernels.py [--targets sm_90a,gfx90a,gfx942,gfx950] [--only SUBSTR,...]
       [--install] [--json OUT] [--doc OUT.md]
--doc writes the AMD resource tables (docs/kernels_resources.md is this output for the full run
of the default targets; regenerate it with `python3 tools/check_kernels.py --doc
docs/kernels_resources.md` after a kernel change).
--only keeps the sources whose file name contains one of the substrings (e.g.
--only fwd_bf16_d128 while iterating on one kernel; the full run is the check). The full run
also compiles the torch bindings (hip_src/bindings/*.cpp, hipified) syntax-only against the
installed torch's headers: CI builds no extension, so this is where binding code is checked.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import generate_kernels  # noqa: E402
import hipify  # noqa: E402
import rocm_llvm_codegen  # noqa: E402

APT_PACKAGES = ["clang-19", "lld-19", "hipcc", "rocm-device-libs", "libamdhip64-dev"]
ROCM_LLVM_WHEEL = "rocm-llvm-python==7.2.2.562.46"
ALL_TARGETS = ("sm_90a", "gfx90a", "gfx942", "gfx950")
ROCM_LLVM_TARGETS = ("gfx942", "gfx950")  # front end clang-19, the rest ROCm LLVM
EXTRA_TARGETS = ("sm_100",)  # asked for by name: --targets sm_100


@dataclass
class Result:
    target: str
    source: str
    ok: bool
    log: str = ""
    kernels: list = field(default_factory=list)  # [{name, registers, spills, ...}]


def device_lib_path() -> str:
    """The amdgcn bitcode folder of Debian's rocm-device-libs."""
    out = subprocess.run(["dpkg", "-L", "rocm-device-libs"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.rstrip("/").endswith("amdgcn/bitcode"):
            return line.strip()
    return "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"


def install_toolchain(rocm_llvm: bool) -> None:
    if rocm_llvm and not rocm_llvm_codegen.available():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", ROCM_LLVM_WHEEL], check=True)
    if shutil.which("clang++-19") and Path("/usr/include/hip/hip_runtime.h").exists():
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], check=True, env=env)


# The device libraries clang's HIP driver links for a gfx9 device compile (clang -### shows the
# list), with Debian's newest ISA version (gfx940) standing in for gfx942 / gfx950 and code object
# version 5's ABI.
DEVICE_LIBS = ["hip", "ocml", "ockl", "oclc_daz_opt_off", "oclc_unsafe_math_off",
               "oclc_finite_only_off", "oclc_correctly_rounded_sqrt_on", "oclc_wavefrontsize64_on",
               "oclc_isa_version_940", "oclc_abi_version_500"]
# Predefined macros that differ from the front end's own arch (gfx942) for each ROCm LLVM target.
FRONT_END_MACROS = {
    "gfx942": [],
    "gfx950": ["-U__gfx942__", "-D__gfx950__=1", "-U__amdgcn_processor__",
               '-D__amdgcn_processor__="gfx950"', "-U__amdgcn_target_id__",
               '-D__amdgcn_target_id__="gfx950"'],
}


def kernel_sources() -> tuple[list[Path], list[Path]]:
    """(HIP sources, hipified CUDA sources): every .hip of hip_src/ plus generated variants."""
    build = ROOT / "build"
    generated = generate_kernels.generate(build / "gen")
    hip = sorted((ROOT / "hip_src").rglob("*.hip")) + generated
    cuda_dir = build / "cuda_src"
    hipify.translate_tree(ROOT / "hip_src", cuda_dir)
    hipify.translate_tree(build / "gen", cuda_dir / "gen")
    cuda = sorted(p for p in cuda_dir.rglob("*.cu"))
    return hip, cuda


_AMD_FIELDS = {
    "SGPRs": "sgprs", "VGPRs": "vgprs", "AGPRs": "agprs", "ScratchSize [bytes/lane]": "scratch",
    "Occupancy [waves/SIMD]": "occupancy", "SGPRs Spill": "sgpr_spill", "VGPRs Spill": "vgpr_spill",
    "LDS Size [bytes/block]": "lds",
}


def parse_amd_resources(log: str) -> list[dict]:
    kernels, cur = [], None
    for line in log.splitlines():
        m = re.search(r"remark:\s+Function Name: (\S+)", line)
        if m:
            cur = {"name": m.group(1)}
            kernels.append(cur)
            continue
        m = re.search(r"remark:\s+([^:]+(?:\[[^\]]*\])?): (\S+) \[-Rpass-analysis", line)
        if m and cur is not None and m.group(1).strip() in _AMD_FIELDS:
            value = m.group(2)
            cur[_AMD_FIELDS[m.group(1).strip()]] = int(value) if value.isdigit() else value
    for k in kernels:
        # SGPR spills land in VGPR lanes (no memory traffic); VGPR spills and scratch do not.
        k["spills"] = int(k.get("vgpr_spill", 0)) + int(k.get("scratch", 0))
    return kernels


# Per-arch limits for the occupancy formula (occupancy()): LDS per CU and the most waves a SIMD
# holds. gfx90a / gfx942: 64 KiB LDS (MI200 / MI300 CDNA2 / CDNA3 ISA guides); gfx950: 160 KiB
# (CDNA4 ISA guide; LLVM's AMDGPU.td gives gfx950 FeatureAddressableLocalMemorySize163840).
# All three: 8 waves per SIMD, 4 SIMDs per CU, 512 VGPRs per lane per SIMD shared by arch VGPRs
# and AGPRs, allocated in granules of 8 (LLVM AMDGPUBaseInfo: getMaxWavesPerEU,
# getTotalNumVGPRs, getVGPRAllocGranule for gfx90a-class targets).
ARCH_LIMITS = {
    "gfx90a": {"lds_per_cu": 64 * 1024, "max_waves": 8, "vgprs": 512, "vgpr_granule": 8},
    "gfx942": {"lds_per_cu": 64 * 1024, "max_waves": 8, "vgprs": 512, "vgpr_granule": 8},
    "gfx950": {"lds_per_cu": 160 * 1024, "max_waves": 8, "vgprs": 512, "vgpr_granule": 8},
}
SIMDS_PER_CU = 4


def occupancy(arch: str, total_vgprs: int, sgprs: int, lds: int, block: int,
              wave: int = 64) -> tuple[int, str]:
    """Waves per SIMD a kernel can hold on `arch`, and the resource that limits it.

    The rule LLVM's AMDGPU back end applies for its `; Occupancy:` figure (AMDGPUBaseInfo.cpp
    getNumWavesPerEUWithNumVGPRs / getMaxWorkGroupsPerCU, AMDGPUSubtarget.cpp
    getOccupancyWithLocalMemSize, GCNSubtarget.cpp getOccupancyWithNumSGPRs), for the CDNA parts
    with a unified register file:
      VGPRs  min(max_waves, 512 // round_up(total_vgprs, 8)); total_vgprs = arch VGPRs rounded
             up to 4, plus AGPRs (the AccumOffset split; TotalNumVgprs in the assembly)
      SGPRs  8 up to 100 SGPRs (with VCC / XNACK / flat scratch), 7 above (gfx9's 800 per SIMD)
      LDS    groups = min(LDS per CU // lds, groups per CU), groups per CU = 32 for one-wave
             blocks, else min(32 // waves per block, 16 barriers);
             waves = min(max_waves, ceil(groups * waves per block / 4 SIMDs)); 1 if no group fits
    `block` is the launch bound (max_flat_workgroup_size); `lds` the static LDS per block
    (dynamic LDS is set at launch and is not in the code object).
    """
    lim = ARCH_LIMITS[arch]
    max_waves = lim["max_waves"]
    granule = lim["vgpr_granule"]
    per_wave = -(-max(total_vgprs, 1) // granule) * granule  # rounded up to the granule
    vgpr_waves = min(max_waves, max(1, lim["vgprs"] // per_wave))
    sgpr_waves = min(max_waves, 8 if sgprs <= 100 else 7)
    waves_per_block = -(-max(block, 1) // wave)
    waves_per_cu = SIMDS_PER_CU * max_waves
    groups_cap = waves_per_cu if waves_per_block == 1 else min(waves_per_cu // waves_per_block, 16)
    groups = lim["lds_per_cu"] // lds if lds else groups_cap
    resident = min(groups, groups_cap) * waves_per_block  # waves per CU
    lds_waves = 1 if groups == 0 else min(max_waves, -(-resident // SIMDS_PER_CU))
    limits = {"VGPRs": vgpr_waves, "SGPRs": sgpr_waves, "LDS": lds_waves}
    waves = min(limits.values())
    limiter = "none" if waves == max_waves else "/".join(k for k, v in limits.items() if v == waves)
    return waves, limiter


_ASM_COMMENTS = {
    "NumVgprs": "vgprs", "NumAgprs": "agprs", "TotalNumVgprs": "total_vgprs",
    "ScratchSize": "scratch", "Occupancy": "occupancy", "LDSByteSize": "lds",
    "NumSGPRsForWavesPerEU": "sgprs_for_waves",
}
_ASM_METADATA = {
    ".sgpr_spill_count": "sgpr_spill", ".vgpr_spill_count": "vgpr_spill",
    ".max_flat_workgroup_size": "block", ".wavefront_size": "wave",
    ".group_segment_fixed_size": "lds", ".private_segment_fixed_size": "scratch",
    ".uses_dynamic_stack": "dynamic_stack",
}


def parse_amdgpu_asm(asm: str, arch: str) -> list[dict]:
    """Per-kernel resources from AMDGPU assembly written with verbose comments: the
    `; Kernel info:` block after each kernel (registers, scratch, LDS, the compiler's occupancy)
    and the `.amdgpu_metadata` code object metadata (spill counts, block bound, wave size).
    Adds `waves` / `limit` from occupancy() and `spills` = VGPR spills + scratch bytes."""
    kernels: dict[str, dict] = {}
    entries: list[dict] = []  # one per kernel of the metadata's .kernels list
    sgprs: dict[str, int] = {}
    name = None
    in_meta = False
    for line in asm.splitlines():
        if in_meta:
            if line.strip() == ".end_amdgpu_metadata":
                break
            m = re.match(r"  (- |  )(\.[a-z_]+):\s+(\S+)$", line)  # kernel-level keys only
            if m:
                if m.group(1) == "- ":
                    entries.append({})
                if entries:
                    entries[-1][m.group(2)] = m.group(3)
            elif line.startswith("  - "):
                entries.append({})
            continue
        if line.strip() == ".amdgpu_metadata":
            in_meta = True
            continue
        m = re.match(r"\s*\.size\s+([^,\s]+),\s*\.Lfunc_end", line)
        if m:
            name = m.group(1)
        elif line.startswith("; Kernel info:") and name is not None:
            kernels[name] = {"name": name}
        elif (m := re.match(r"\s*\.set\s+(\S+)\.numbered_sgpr,\s*(\d+)$", line)):
            # The numbered SGPRs, as clang's resource remark counts them (VCC, XNACK mask and
            # flat scratch come on top: NumSGPRsForWavesPerEU).
            sgprs[m.group(1)] = int(m.group(2))
        elif name in kernels:
            m = re.match(r"; (\w+)\s*[:=]\s*(\d+)", line)
            if m and m.group(1) in _ASM_COMMENTS:
                kernels[name][_ASM_COMMENTS[m.group(1)]] = int(m.group(2))
    for entry in entries:
        k = kernels.get(entry.get(".name", ""))
        if k is None:
            continue
        for key, field_name in _ASM_METADATA.items():
            if key in entry:
                value = entry[key]
                k.setdefault(field_name, int(value) if value.isdigit() else value)
    for k in kernels.values():
        if k["name"] in sgprs:
            k["sgprs"] = sgprs[k["name"]]
        k["spills"] = int(k.get("vgpr_spill", 0)) + int(k.get("scratch", 0))
        if "total_vgprs" in k and "block" in k and arch in ARCH_LIMITS:
            k["waves"], k["limit"] = occupancy(arch, k["total_vgprs"],
                                               k.get("sgprs_for_waves", 0),
                                               k.get("lds", 0), k["block"], k.get("wave", 64))
    return list(kernels.values())


def parse_ptxas(log: str) -> list[dict]:
    kernels, cur = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = {"name": m.group(1)}
            kernels.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"] = int(m.group(1))
            cur["spills"] = int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
    return kernels


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def compile_rocm_llvm(target: str, src: Path, include: Path, out_dir: Path) -> Result:
    """Front end (clang-19, device libraries linked, no LLVM passes) to bitcode, then
    tools/rocm_llvm_codegen.py (ROCm LLVM: O3 and code generation) to assembly."""
    bc, asm = out_dir / (src.stem + ".bc"), out_dir / (src.stem + ".s")
    libs = device_lib_path()
    front = ["clang++-19", "-x", "hip", "--offload-arch=gfx942", "--rocm-path=/usr", "-O3",
             "-std=c++17", "-Wall", "-Werror", "-I", str(include), "--cuda-device-only",
             "-nogpulib", *FRONT_END_MACROS[target]]
    for lib in DEVICE_LIBS:
        front += ["-Xclang", "-mlink-builtin-bitcode", "-Xclang", f"{libs}/{lib}.bc"]
    front += ["-Xclang", "-disable-llvm-passes", "-emit-llvm", "-c", str(src), "-o", str(bc)]
    proc = subprocess.run(front, capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode == 0:
        back = [sys.executable, str(ROOT / "tools" / "rocm_llvm_codegen.py"), str(bc),
                "--arch", target, "-o", str(asm)]
        proc = subprocess.run(back, capture_output=True, text=True, check=False)
        log += proc.stdout + proc.stderr
    # ROCm LLVM's back-end diagnostics (e.g. a stack-size warning) are errors here as well.
    ok = proc.returncode == 0 and not re.search(r"\b(warning|error):", log)
    kernels = parse_amdgpu_asm(asm.read_text(), target) if ok else []
    return Result(target, _rel(src), ok, "" if ok else log, kernels)


def compile_one(target: str, src: Path, include: Path, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    if target in ROCM_LLVM_TARGETS:
        return compile_rocm_llvm(target, src, include, out_dir)
    obj = out_dir / (src.stem + ".o")
    if target.startswith("sm_"):
        num = target[3:]
        cmd = ["nvcc", f"-gencode=arch=compute_{num},code=sm_{num}", "-O3", "-std=c++17",
               "--Werror", "all-warnings", "-Xptxas", "-v", "-I", str(include), "-c", str(src),
               "-o", str(obj)]
        if target == "sm_90a":  # what setup.py defines for a build with sm_90a code
            cmd.insert(1, "-DRA_WGMMA_BUILD=1")
    else:
        cmd = ["clang++-19", "-x", "hip", f"--offload-arch={target}", "--rocm-path=/usr",
               "-O3", "-std=c++17", "-Wall", "-Werror", "-I", str(include),
               f"--rocm-device-lib-path={device_lib_path()}",
               "-Rpass-analysis=kernel-resource-usage",
               "-c", str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    kernels = parse_ptxas(log) if target.startswith("sm_") else parse_amd_resources(log)
    return Result(target, _rel(src), proc.returncode == 0, log if proc.returncode else "", kernels)


def check_bindings() -> list[Result]:
    """The files that include torch (hip_src/bindings/*.cpp, hipified), each through a
    syntax-only C++ compile against this machine's torch headers and CUDA runtime headers: the
    ops' binding code is checked on a machine that builds no extension (no GPU torch)."""
    import sysconfig

    import torch

    cuda_root = ROOT / "build" / "cuda_src"
    tdir = Path(torch.__file__).resolve().parent
    nvcc = Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc").resolve()
    cuda_incs = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include",
                 nvcc.parent.parent / "include"]
    cuda_inc = next((d for d in cuda_incs if (d / "cuda_runtime.h").exists()), cuda_incs[0])
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"
    results = []
    for name in sorted(p.name for p in (ROOT / "hip_src" / "bindings").glob("*.cpp")):
        src = cuda_root / "bindings" / name
        cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wno-c++20-extensions",
               "-I", str(tdir / "include"),
               "-I", str(tdir / "include" / "torch" / "csrc" / "api" / "include"),
               "-I", sysconfig.get_paths()["include"], "-I", str(cuda_inc),
               "-I", str(cuda_root), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        errors = proc.returncode != 0
        results.append(Result("bindings", str(src.relative_to(ROOT)), not errors,
                              (proc.stdout + proc.stderr) if errors else ""))
    return results


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> readable kernel name without its parameter list (c++filt when present)."""
    out = dict(zip(names, names))
    if names and shutil.which("c++filt"):
        proc = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                              check=False)
        lines = proc.stdout.splitlines()
        if len(lines) == len(names):
            out = dict(zip(names, lines))
    return {k: re.sub(r"^(void )?(\w+::)*", "", _drop_parameters(v)) for k, v in out.items()}


def _drop_parameters(name: str) -> str:
    """`ns::f<(E)0>(Params, int)` -> `ns::f<(E)0>`: the trailing balanced parenthesis group."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i]
    return name


TABLE_COLUMNS = ("source", "kernel", "block", "VGPR", "AGPR", "SGPR", "LDS", "scratch",
                 "waves/SIMD", "limit")


def is_empty(k: dict) -> bool:
    """A kernel compiled to nothing here (the Hopper-only warpgroup kernels on AMD): no vector
    register at all (any kernel that reads its thread index has v0)."""
    return k.get("vgprs") == 0 and not k.get("agprs")


def resource_rows(results: list[Result], target: str) -> list[tuple]:
    """(source, kernel, block, VGPRs, AGPRs, SGPRs, LDS bytes, scratch bytes, waves per SIMD,
    limiting resource) per kernel instance of `target`, sorted by source and kernel."""
    ks = [(Path(r.source).stem, k) for r in results if r.target == target for k in r.kernels
          if not is_empty(k)]
    names = demangle(sorted({k["name"] for _, k in ks}))
    rows = []
    for src, k in ks:
        rows.append((src, names[k["name"]], k.get("block", "-"), k.get("vgprs", "-"),
                     k.get("agprs", "-"), k.get("sgprs", "-"), k.get("lds", "-"),
                     k.get("scratch", "-"), k.get("occupancy", "-"), k.get("limit", "-")))
    return sorted(rows, key=lambda r: (r[0], r[1]))


def print_tables(results: list[Result], targets: list[str]) -> None:
    for target in targets:
        rows = resource_rows(results, target)
        if not rows or not target.startswith("gfx"):
            continue
        print(f"== {target}: resources per kernel instance ({len(rows)})")
        widths = [max(len(str(c)) for c in col) for col in zip(TABLE_COLUMNS, *rows)]
        for row in (TABLE_COLUMNS, *rows):
            print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                            for i, (c, w) in enumerate(zip(row, widths))))


DOC_HEADER = """# AMD kernel resources

<!-- Generated by `python3 tools/check_kernels.py --doc docs/kernels_resources.md`; do not edit.
     Regenerate after any kernel change (CI prints the same tables). The last section, the
     plan's choices, alone: `python3 tools/plan_coverage.py --doc docs/kernels_resources.md`
     (no compiler needed; regenerate after a change of rocm_attn/small_seq_plan.py). -->

Every kernel instance as compiled for the AMD targets, without a GPU, by
`tools/check_kernels.py`: gfx90a through Debian's clang-19
(`-Rpass-analysis=kernel-resource-usage`), gfx942 and gfx950 through ROCm's own LLVM (the
`rocm-llvm-python` wheel: `tools/rocm_llvm_codegen.py`). CI fails on any spill or scratch use on
these targets.

Columns: `block` is the launch bound (threads; `-` where the compiler report has none); VGPR are
the architectural vector registers and AGPR the accumulation registers, which share each SIMD's
512-entry file (so the sum sets occupancy); SGPR are the numbered scalar registers (VCC, XNACK
mask and flat scratch come on top); LDS is the static LDS per block in bytes (dynamic LDS, which
the resident forward takes at launch, is not in the code object); scratch is bytes per lane (0
everywhere: no spills, no stack); `waves/SIMD` is the compiler's occupancy; `limit` the resource
that sets it by the formula of `occupancy()` in tools/check_kernels.py (LLVM's rule: VGPRs
`512 // round_up(VGPR rounded up to 4 + AGPR, 8)`, SGPRs 8 up to 100 then 7, LDS by blocks per
CU with 64 KiB on gfx90a / gfx942 and 160 KiB on gfx950; at most 8 waves per SIMD), `none` where
a kernel reaches 8. The last section lists which benchmark runs the plan
(`rocm_attn/small_seq_plan.py`) sends to each instance on each of these archs.
"""


def write_doc(path: Path, results: list[Result], targets: list[str]) -> None:
    parts = [DOC_HEADER]
    for target in targets:
        rows = resource_rows(results, target)
        if not rows or not target.startswith("gfx"):
            continue
        waves = [r[8] for r in rows if isinstance(r[8], int)]
        hist = ", ".join(f"{w}: {waves.count(w)}" for w in sorted(set(waves)))
        empty = sum(is_empty(k) for r in results if r.target == target for k in r.kernels)
        parts.append(f"\n## {target}\n\n{len(rows)} kernel instances; kernels per waves/SIMD: "
                     f"{hist}. Not listed: {empty} instances compiled empty for {target} "
                     "(the Hopper-only warpgroup kernels).\n\n")
        parts.append("| " + " | ".join(TABLE_COLUMNS) + " |\n")
        parts.append("|" + "---|" * 2 + "---:|" * (len(TABLE_COLUMNS) - 3) + "---|\n")
        for row in rows:
            cells = [f"`{c}`" if i == 1 else str(c) for i, c in enumerate(row)]
            parts.append("| " + " | ".join(cells) + " |\n")
    import plan_coverage  # the plan's choices per arch (imports rocm_attn, so only here)

    parts.append("\n" + plan_coverage.doc_section())
    path.write_text("".join(parts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(ALL_TARGETS))
    parser.add_argument("--install", action="store_true",
                        help="apt-get install the HIP toolchain, pip install ROCm LLVM, if missing")
    parser.add_argument("--allow-spills", action="store_true")
    parser.add_argument("--json", type=Path, help="write the full per-kernel report here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", default="", help="comma-separated file-name substrings to keep")
    parser.add_argument("--tables", action="store_true",
                        help="print every AMD target's per-kernel resource table")
    parser.add_argument("--doc", type=Path, help="write the AMD resource tables as Markdown here")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(ALL_TARGETS) - set(EXTRA_TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from "
                     f"{ALL_TARGETS + EXTRA_TARGETS}")
    if args.install and any(t.startswith("gfx") for t in targets):
        install_toolchain(any(t in ROCM_LLVM_TARGETS for t in targets))
    if any(t in ROCM_LLVM_TARGETS for t in targets) and not rocm_llvm_codegen.available():
        print(f"check_kernels: {', '.join(t for t in targets if t in ROCM_LLVM_TARGETS)} need "
              f"ROCm LLVM: pip install {ROCM_LLVM_WHEEL} (or use --install)")
        return 1
    hip, cuda = kernel_sources()
    jobs = []
    for target in targets:
        nv = target.startswith("sm_")
        tool = "nvcc" if nv else "clang++-19"
        if shutil.which(tool) is None:
            print(f"check_kernels: {tool} not found for {target} (use --install for the HIP toolchain)")
            return 1
        include = ROOT / "build" / "cuda_src" if nv else ROOT / "hip_src"
        only = [o for o in args.only.split(",") if o]
        for src in (cuda if nv else hip):
            if only and not any(o in src.name for o in only):
                continue
            jobs.append((target, src, include, ROOT / "build" / "check" / target))
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: compile_one(*j), jobs))
        bindings = pool.submit(check_bindings).result() if not args.only else []
        for b in bindings:
            print(f"bindings: {'ok' if b.ok else 'FAILED'} ({b.source}, syntax-only against "
                  "this machine's torch headers)")
    failed = [r for r in results + bindings if not r.ok]
    spilled = [(r, k) for r in results for k in r.kernels if k.get("spills", 0)]
    for r in failed:
        print(f"FAIL {r.target} {r.source}\n{r.log}")
    print(f"{'target':7s} {'files':>5s} {'kernels':>7s} {'max regs':>8s} {'min occ':>7s} {'spills':>6s}")
    for target in targets:
        rs = [r for r in results if r.target == target]
        ks = [k for r in rs for k in r.kernels]
        regs = max((k.get("registers", k.get("vgprs", 0)) for k in ks), default=0)
        occ = min((k["occupancy"] for k in ks if "occupancy" in k), default="-")
        print(f"{target:7s} {len(rs):5d} {len(ks):7d} {regs:8} {occ:>7} {sum(k.get('spills', 0) for k in ks):6d}")
    if args.tables:
        print_tables(results, targets)
    for r in results:
        for k in r.kernels:
            if "waves" in k and k["waves"] != k.get("occupancy"):
                print(f"NOTE {r.target} {k['name']}: occupancy() gives {k['waves']} waves/SIMD, "
                      f"the compiler {k.get('occupancy')}")
    for r, k in spilled:
        print(f"SPILL {r.target} {r.source} {k['name']}: {k}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.doc:
        write_doc(args.doc, results, targets)
        print(f"check_kernels: wrote {args.doc}")
    amd_spills = [(r, k) for r, k in spilled if r.target.startswith("gfx")]
    if failed or (amd_spills and not args.allow_spills):
        return 1
    print(f"check_kernels: {len(results)} compiles passed for {', '.join(targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
