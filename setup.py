"""Build of rocm_attn.

BUILD_TARGET=auto|rocm|cuda|cpu (default auto) picks what to build:
  rocm : a ROCm build of torch -> hipcc compiles hip_src/ into rocm_attn._C
         (arches from GPU_ARCHS or PYTORCH_ROCM_ARCH, default "gfx942;gfx90a"). hipcc is found
         through ROCM_HOME/ROCM_PATH, /opt/rocm, PATH, or the ROCm SDK wheel (`rocm-sdk path
         --root`): see find_rocm_home.
  cuda : a CUDA build of torch -> tools/hipify.py writes CUDA sources under build/cuda_src,
         nvcc compiles them for sm_90a (or for TORCH_CUDA_ARCH_LIST when set; the Hopper
         warpgroup-MMA kernels need "9.0a" there, plain "9.0" builds them empty).
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
DEFAULT_CUDA_GENCODE = "-gencode=arch=compute_90a,code=sm_90a"


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
    "rocm": "Install ROCm (hipcc) and set ROCM_HOME, or install the ROCm SDK wheel that "
            "provides `rocm-sdk path --root`",
}


def _compiler_problem(target: str):
    """Why the GPU compiler for target is missing (None when it is there)."""
    if target == "cuda":
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME is None or shutil.which("nvcc", path=str(Path(CUDA_HOME) / "bin")) is None:
            return "a CUDA build of torch is installed but nvcc was not found"
    if target == "rocm":
        home, looked = find_rocm_home()
        if home is None:
            return ("a ROCm build of torch is installed but hipcc/ROCM_HOME was not found "
                    f"(looked in: {'; '.join(looked)})")
        use_rocm_home(home)
    return None


def _hipcc_home(path: Path):
    """The ROCm root holding ``path`` as ``bin/hipcc`` (or ``hip/bin/hipcc``), else None."""
    for home in (path, path / "hip"):
        if (home / "bin" / "hipcc").is_file():
            return path
    return None


def _rocm_sdk_root():
    """``rocm-sdk path --root``: where a ROCm-10-style Python wheel (TheRock's ``rocm[devel]``)
    keeps bin/hipcc, include/ and lib/; None when the command is absent or fails."""
    import subprocess

    exe = shutil.which("rocm-sdk")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "path", "--root"], capture_output=True, text=True,
                              timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return Path(lines[-1].strip()) if lines else None


OPT_ROCM = Path("/opt/rocm")


def find_rocm_home(opt_rocm: Path = None):
    """``(ROCm root with bin/hipcc, places looked)``; the root is None when none has hipcc.

    In order: ``ROCM_HOME`` / ``ROCM_PATH``; ``/opt/rocm`` (the classic packages and the
    rocm/pytorch images); the directory above the ``hipcc`` on ``PATH``; the ROCm SDK wheel
    (``rocm-sdk path --root``, else the ``_rocm_sdk_devel`` / ``_rocm_sdk_core`` package
    directories). Older torch finds only the first three, so the root found here is handed to
    torch's build through ``ROCM_HOME`` (:func:`use_rocm_home`).
    """
    import importlib.util

    opt_rocm = OPT_ROCM if opt_rocm is None else opt_rocm
    looked = []

    def candidates():
        for var in ("ROCM_HOME", "ROCM_PATH"):
            if os.environ.get(var):
                yield f"${var}", Path(os.environ[var])
        yield str(opt_rocm), opt_rocm
        hipcc = shutil.which("hipcc")
        if hipcc:
            # <root>/bin/hipcc or <root>/hip/bin/hipcc, through any symlinks
            root = Path(os.path.realpath(hipcc)).parent.parent
            yield "hipcc on PATH", root.parent if root.name == "hip" else root
        else:
            looked.append("hipcc on PATH (none)")
        root = _rocm_sdk_root()
        if root is not None:
            yield "rocm-sdk path --root", root
        else:
            looked.append("rocm-sdk path --root (no rocm-sdk command)")
        for module in ("_rocm_sdk_devel", "_rocm_sdk_core"):
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.submodule_search_locations:
                yield f"the {module} wheel", Path(list(spec.submodule_search_locations)[0])

    for label, path in candidates():
        home = _hipcc_home(path)
        if home is not None:
            return str(home), looked
        looked.append(f"{label} = {path} (no bin/hipcc)")
    return None, looked


def use_rocm_home(home: str) -> None:
    """Point torch's extension build at ``home`` (set before or after it was imported)."""
    os.environ["ROCM_HOME"] = home
    ext = sys.modules.get("torch.utils.cpp_extension")
    if ext is not None and getattr(ext, "ROCM_HOME", None) != home:
        ext.ROCM_HOME = home


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
    locale facets and segfaulted instead of raising (seen on the H200 image).
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


def binding_sources(src_root: Path) -> list[str]:
    """The files that include torch: every hip_src/bindings/*.cpp, under src_root (hip_src or
    its hipified copy; listed from hip_src, so a stale copy of a deleted file is never built).
    Each registers its own ops (TORCH_LIBRARY_FRAGMENT), so a new one needs no edit here."""
    names = sorted(p.name for p in (ROOT / "hip_src" / "bindings").glob("*.cpp"))
    return [str(src_root / "bindings" / name) for name in names]


def extension_for(target: str):
    """The rocm_attn._C extension for a GPU target, sources generated as needed."""
    import generate_kernels
    from torch.utils.cpp_extension import CUDAExtension

    build = ROOT / "build"
    generated = generate_kernels.generate(build / "gen")
    kernels = [p.stem for p in generated if p.name != generate_kernels.PLAN_CHECK]
    hip_sources = sorted((ROOT / "hip_src").rglob("*.hip")) + generated
    # NOTE: no -std flag: torch's BuildExtension adds the standard its headers need (C++17 for
    # torch 2.11, C++20 for newer releases).
    cxx_flags = ["-O3"]
    if target == "cuda":
        import hipify

        cuda_src = build / "cuda_src"
        hipify.translate_tree(ROOT / "hip_src", cuda_src)
        hipify.translate_tree(build / "gen", cuda_src / "gen")
        sources = sorted(str(p) for p in cuda_src.rglob("*.cu")) + binding_sources(cuda_src)
        nvcc_flags = ["-O3", "--use_fast_math", "-lineinfo"]
        if os.environ.get("ROCM_ATTN_PTXAS_VERBOSE"):
            nvcc_flags.append("-Xptxas=-v")  # registers / spills per kernel in the build log
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
        if not arch_list:
            nvcc_flags.append(DEFAULT_CUDA_GENCODE)
        archs = arch_list.split(";") if arch_list else ["sm_90a"]
        # The host side may select the sm_90a-only kernels (common/device_info.h
        # ra_device_warpgroup_mma) only where the build has their code.
        if not arch_list or any(a.strip().startswith("9.0a") for a in archs):
            nvcc_flags.append("-DRA_WGMMA_BUILD=1")
            cxx_flags.append("-DRA_WGMMA_BUILD=1")
        include = [str(cuda_src)]
    else:
        archs_env = os.environ.get("GPU_ARCHS") or os.environ.get("PYTORCH_ROCM_ARCH") or DEFAULT_ROCM_ARCHS
        archs = [a for a in archs_env.replace(",", ";").split(";") if a]
        bad = [a for a in archs if not a.startswith("gfx")]
        if bad:
            sys.exit(f"rocm_attn: GPU_ARCHS entries must be gfx targets, got {bad}")
        os.environ["PYTORCH_ROCM_ARCH"] = ";".join(archs)
        sources = [str(p) for p in hip_sources] + binding_sources(ROOT / "hip_src")
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
