"""Compile every kernel source for every target, with no GPU, and report resources.

Targets:
  sm_90a  hipified sources (tools/hipify.py) through nvcc -gencode=arch=compute_90a,code=sm_90a
          (the build's default: the Hopper warpgroup-MMA kernels exist only there)
  sm_100  the same through nvcc for sm_100 (B200/GB200; nvcc >= 12.8), not in the default set
  gfx90a  HIP sources through Debian's clang-19 HIP front end, full compile, with
          -Rpass-analysis=kernel-resource-usage (VGPRs, SGPRs, scratch, occupancy, spills)
  gfx942  HIP sources, device-only compile to assembly (Debian's device libraries stop at
          gfx940, hence -nogpulib)
Warnings are errors. Spills to scratch on AMD targets fail the check unless --allow-spills;
nvcc's own register heuristics sometimes trade a few bytes of local memory for occupancy on
sm_90a, so spills there are reported, not fatal. --install apt-installs clang-19 and the HIP headers when missing.

Usage: python tools/check_kernels.py [--targets sm_90a,gfx90a,gfx942] [--only SUBSTR,...] [--install]
       [--json OUT]
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

APT_PACKAGES = ["clang-19", "lld-19", "hipcc", "rocm-device-libs", "libamdhip64-dev"]
ALL_TARGETS = ("sm_90a", "gfx90a", "gfx942")
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


def install_toolchain() -> None:
    if shutil.which("clang++-19") and Path("/usr/include/hip/hip_runtime.h").exists():
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], check=True, env=env)


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


def compile_one(target: str, src: Path, include: Path, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    obj = out_dir / (src.stem + (".s" if target == "gfx942" else ".o"))
    if target.startswith("sm_"):
        num = target[3:]
        cmd = ["nvcc", f"-gencode=arch=compute_{num},code=sm_{num}", "-O3", "-std=c++17",
               "--Werror", "all-warnings", "-Xptxas", "-v", "-I", str(include), "-c", str(src),
               "-o", str(obj)]
        if target == "sm_90a":  # what setup.py defines for a build with sm_90a code
            cmd.insert(1, "-DRA_WGMMA_BUILD=1")
    else:
        cmd = ["clang++-19", "-x", "hip", f"--offload-arch={target}", "--rocm-path=/usr",
               "-O3", "-std=c++17", "-Wall", "-Werror", "-I", str(include)]
        if target == "gfx90a":
            cmd += [f"--rocm-device-lib-path={device_lib_path()}", "-Rpass-analysis=kernel-resource-usage",
                    "-c", str(src), "-o", str(obj)]
        else:
            cmd += ["--cuda-device-only", "-nogpulib", "-S", str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    kernels = parse_ptxas(log) if target.startswith("sm_") else parse_amd_resources(log)
    return Result(target, str(src.relative_to(ROOT)), proc.returncode == 0, log if proc.returncode else "", kernels)


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(ALL_TARGETS))
    parser.add_argument("--install", action="store_true", help="apt-get install the HIP toolchain if missing")
    parser.add_argument("--allow-spills", action="store_true")
    parser.add_argument("--json", type=Path, help="write the full per-kernel report here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", default="", help="comma-separated file-name substrings to keep")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(ALL_TARGETS) - set(EXTRA_TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from "
                     f"{ALL_TARGETS + EXTRA_TARGETS}")
    if args.install and any(t.startswith("gfx") for t in targets):
        install_toolchain()
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
    for r, k in spilled:
        print(f"SPILL {r.target} {k['name']}: {k}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    amd_spills = [(r, k) for r, k in spilled if r.target.startswith("gfx")]
    if failed or (amd_spills and not args.allow_spills):
        return 1
    print(f"check_kernels: {len(results)} compiles passed for {', '.join(targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
