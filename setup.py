"""Build of rocm_attn.

BUILD_TARGET=auto|rocm|cuda|cpu (default auto) picks what to build:
  rocm : a ROCm build of torch -> hipcc compiles hip_src/ into rocm_attn._C
         (arches from GPU_ARCHS or PYTORCH_ROCM_ARCH, default "gfx942;gfx90a").
  cuda : a CUDA build of torch -> tools/hipify.py writes CUDA sources under build/cuda_src,
         nvcc compiles them for sm_90 (or for TORCH_CUDA_ARCH_LIST when set).
  cpu  : no extension; every public API runs on its torch path.
auto chooses from the installed torch. ROCM_ATTN_FORCE_CPU=1 skips the extension.
Build against the torch already installed: `pip install --no-build-isolation .`
(an isolated build would download a multi-GB CUDA torch).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

VALID_TARGETS = ("auto", "rocm", "cuda", "cpu")
DEFAULT_ROCM_ARCHS = "gfx942;gfx90a"
DEFAULT_CUDA_GENCODE = "-gencode=arch=compute_90,code=sm_90"


def pick_target() -> str:
    """Resolve BUILD_TARGET against the installed torch, failing loudly on a contradiction."""
    if os.environ.get("ROCM_ATTN_FORCE_CPU", "0") not in ("", "0"):
        return "cpu"
    target = os.environ.get("BUILD_TARGET", "auto").lower()
    if target not in VALID_TARGETS:
        sys.exit(f"rocm_attn: BUILD_TARGET={target!r} is not one of {VALID_TARGETS}")
    try:
        import torch
    except ImportError:
        sys.exit(
            "rocm_attn: torch must be installed before building (pip install torch), and the "
            "build must see it: pip install --no-build-isolation ."
        )
    has_rocm = torch.version.hip is not None
    has_cuda = torch.version.cuda is not None
    explicit = target != "auto"
    if target == "auto":
        target = "rocm" if has_rocm else "cuda" if has_cuda else "cpu"
    if not explicit and target != "cpu" and _compiler_problem(target) and not _gpu_visible(torch):
        # A GPU build of torch on a machine with neither a GPU nor its compiler: the usual
        # case is a CPU machine that got PyPI's default (CUDA) torch wheel. Install the
        # pure-Python package rather than fail; BUILD_TARGET=cuda|rocm makes this an error.
        print(f"rocm_attn: {_compiler_problem(target)}; no GPU is visible either, so the package "
              "is installed without kernels (torch path). Set BUILD_TARGET="
              f"{target} to make this an error.", file=sys.stderr)
        return "cpu"
    if target == "rocm" and not has_rocm:
        sys.exit("rocm_attn: BUILD_TARGET=rocm needs a ROCm build of torch")
    if target == "cuda" and not has_cuda:
        sys.exit("rocm_attn: BUILD_TARGET=cuda needs a CUDA build of torch")
    problem = _compiler_problem(target) if target != "cpu" else None
    if problem:
        sys.exit(f"rocm_attn: {problem}. {_COMPILER_FIX[target]}, or build the pure-Python "
                 "package with ROCM_ATTN_FORCE_CPU=1.")
    return target


_COMPILER_FIX = {
    "cuda": "Install the CUDA toolkit matching torch.version.cuda and set CUDA_HOME",
    "rocm": "Install ROCm (hipcc) and set ROCM_HOME",
}


def _compiler_problem(target: str):
    """Why the GPU compiler for target is missing (None when it is there)."""
    if target == "cuda":
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME is None or shutil.which("nvcc", path=str(Path(CUDA_HOME) / "bin")) is None:
            return "a CUDA build of torch is installed but nvcc was not found"
    if target == "rocm":
        from torch.utils.cpp_extension import ROCM_HOME

        if ROCM_HOME is None:
            return "a ROCm build of torch is installed but hipcc/ROCM_HOME was not found"
    return None


def _gpu_visible(torch) -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:  # a broken driver install counts as no GPU for this decision
        return False


def write_build_config(target: str, archs: list[str], kernels: list[str]) -> None:
    """Record what was built, for rocm_attn.build_info()."""
    config = {"backend": target, "archs": archs, "kernels": kernels}
    (ROOT / "rocm_attn" / "_build_config.json").write_text(json.dumps(config, indent=1) + "\n")


def loaded_libstdcxx() -> list[str]:
    """The shared libstdc++ this process (torch) has loaded, as a link argument ([] if none).

    The GPU image's toolchain (/opt/gcc) ships only a static libstdc++, so g++ copied its
    iostream and locale code into the extension; when a TORCH_CHECK streamed a number into its
    message, torch's stream (the process's libstdc++) ran the copy's code with the process's
    locale facets and segfaulted instead of raising (H200 image, docs/NOTES.md, session 6).
    Naming the loaded library on the link line resolves those symbols to it, ahead of the
    compiler's implicit -lstdc++, so the extension shares one C++ runtime with torch.
    """
    import torch  # noqa: F401  (loads the C++ runtime the extension must share)

    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux: the platform's usual linking applies
        return []
    for line in maps:
        fields = line.split()  # address perms offset dev inode [path]
        if len(fields) >= 6 and Path(fields[-1]).name.startswith("libstdc++.so"):
            return [fields[-1]]
    return []


def extension_for(target: str):
    """The rocm_attn._C extension for a GPU target, sources generated as needed."""
    import generate_kernels
    from torch.utils.cpp_extension import CUDAExtension

    build = ROOT / "build"
    generated = generate_kernels.generate(build / "gen")
    kernels = [p.stem for p in generated]
    hip_sources = sorted((ROOT / "hip_src").rglob("*.hip")) + generated
    # NOTE: no -std flag: torch's BuildExtension adds the standard its headers need (C++17 for
    # torch 2.11, C++20 for newer releases).
    cxx_flags = ["-O3"]
    if target == "cuda":
        import hipify

        cuda_src = build / "cuda_src"
        hipify.translate_tree(ROOT / "hip_src", cuda_src)
        hipify.translate_tree(build / "gen", cuda_src / "gen")
        sources = sorted(str(p) for p in cuda_src.rglob("*.cu")) + [str(cuda_src / "torch_bindings.cpp")]
        nvcc_flags = ["-O3", "--use_fast_math", "-lineinfo"]
        if os.environ.get("ROCM_ATTN_PTXAS_VERBOSE"):
            nvcc_flags.append("-Xptxas=-v")  # registers / spills per kernel in the build log
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
        if not arch_list:
            nvcc_flags.append(DEFAULT_CUDA_GENCODE)
        archs = arch_list.split(";") if arch_list else ["sm_90"]
        include = [str(cuda_src)]
    else:
        archs_env = os.environ.get("GPU_ARCHS") or os.environ.get("PYTORCH_ROCM_ARCH") or DEFAULT_ROCM_ARCHS
        archs = [a for a in archs_env.replace(",", ";").split(";") if a]
        bad = [a for a in archs if not a.startswith("gfx")]
        if bad:
            sys.exit(f"rocm_attn: GPU_ARCHS entries must be gfx targets, got {bad}")
        os.environ["PYTORCH_ROCM_ARCH"] = ";".join(archs)
        sources = [str(p) for p in hip_sources] + [str(ROOT / "hip_src" / "torch_bindings.cpp")]
        nvcc_flags = ["-O3"] + [f"--offload-arch={a}" for a in archs]
        include = [str(ROOT / "hip_src")]
    write_build_config(target, archs, kernels)
    return CUDAExtension(
        name="rocm_attn._C",
        sources=[os.path.relpath(s, ROOT) for s in sources],
        include_dirs=include,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=loaded_libstdcxx(),
    )


def main() -> None:
    target = pick_target()
    ext_modules, cmdclass = [], {}
    if target == "cpu":
        write_build_config("cpu", [], [])
    else:
        from torch.utils.cpp_extension import BuildExtension

        ext_modules = [extension_for(target)]
        cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=True)}
    setup(
        packages=find_packages(include=["rocm_attn", "rocm_attn.*"]),
        package_data={"rocm_attn": ["_build_config.json"]},
        ext_modules=ext_modules,
        cmdclass=cmdclass,
    )


if __name__ == "__main__":  # how pip's build backend and `python3 setup.py ...` run this file
    main()
