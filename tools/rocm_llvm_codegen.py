"""Optimise and code-generate AMDGPU LLVM bitcode with ROCm's own LLVM, from the
`rocm-llvm-python` wheel, and print the assembly.

The wheel (PyPI `rocm-llvm-python`) ships ROCm's LLVM as one shared library,
`rocm/llvm/librocmllvm.so`, exporting LLVM's C API with the AMDGPU target; its Comgr
bindings load the system's libamd_comgr (Debian's knows no gfx942 / gfx950) and it has no
clang front end. So tools/check_kernels.py runs the front end (Debian's clang-19, HIP to
unoptimised bitcode with the device libraries linked, as clang itself links them before its
optimiser) and this script does the rest the way clang's back-end step does: ROCm LLVM's
`default<O3>` pipeline with the AMDGPU target machine, then code generation to assembly.
Every function is re-targeted to --arch first (the front end may have been told a close
relative: clang-19 knows no gfx950).

Usage: python tools/rocm_llvm_codegen.py IN.bc --arch gfx950 -o OUT.s
The assembly carries the resource usage (the code object metadata and the `; NumVgprs:`
comments) that check_kernels.parse_amdgpu_asm reads.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

TRIPLE = b"amdgcn-amd-amdhsa"
# Back-end options clang's HIP driver passes for a device compile (clang -### shows them).
LLVM_OPTIONS = [b"-amdgpu-internalize-symbols"]


def library_path() -> Path:
    """librocmllvm.so of the installed rocm-llvm-python wheel (ImportError when missing)."""
    import importlib.util

    spec = importlib.util.find_spec("rocm.llvm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("rocm-llvm-python is not installed (pip install rocm-llvm-python)")
    lib = Path(next(iter(spec.submodule_search_locations))) / "librocmllvm.so"
    if not lib.exists():
        raise ImportError(f"rocm-llvm-python has no {lib}")
    return lib


def available() -> bool:
    try:
        library_path()
    except ImportError:
        return False
    return True


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path()))
    p, c, i, u = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint
    sigs = {
        "LLVMContextCreate": (p, []),
        "LLVMCreateMemoryBufferWithMemoryRangeCopy": (p, [c, ctypes.c_size_t, c]),
        "LLVMParseBitcodeInContext2": (i, [p, p, ctypes.POINTER(p)]),
        "LLVMGetTargetFromTriple": (i, [c, ctypes.POINTER(p), ctypes.POINTER(c)]),
        "LLVMCreateTargetMachine": (p, [p, c, c, c, i, i, i]),
        "LLVMCreateTargetDataLayout": (p, [p]),
        "LLVMCopyStringRepOfTargetData": (p, [p]),
        "LLVMSetDataLayout": (None, [p, c]),
        "LLVMSetTarget": (None, [p, c]),
        "LLVMGetFirstFunction": (p, [p]),
        "LLVMGetNextFunction": (p, [p]),
        "LLVMRemoveStringAttributeAtIndex": (None, [p, u, c, u]),
        "LLVMAddTargetDependentFunctionAttr": (None, [p, c, c]),
        "LLVMCreatePassBuilderOptions": (p, []),
        "LLVMRunPasses": (p, [p, c, p, p]),
        "LLVMGetErrorMessage": (p, [p]),
        "LLVMTargetMachineEmitToMemoryBuffer": (i, [p, p, i, ctypes.POINTER(c), ctypes.POINTER(p)]),
        "LLVMGetBufferStart": (p, [p]),
        "LLVMGetBufferSize": (ctypes.c_size_t, [p]),
        "LLVMParseCommandLineOptions": (None, [i, ctypes.POINTER(c), c]),
        "LLVMSetTargetMachineAsmVerbosity": (None, [p, i]),
        "LLVMPrintModuleToString": (p, [p]),
        "LLVMPassBuilderOptionsSetLoopInterleaving": (None, [p, i]),
        "LLVMPassBuilderOptionsSetLoopVectorization": (None, [p, i]),
        "LLVMPassBuilderOptionsSetSLPVectorization": (None, [p, i]),
        "LLVMPassBuilderOptionsSetLoopUnrolling": (None, [p, i]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    for name in ("TargetInfo", "Target", "TargetMC", "AsmPrinter"):
        getattr(lib, f"LLVMInitializeAMDGPU{name}")()
    return lib


def codegen(bitcode: bytes, arch: str, options: list[bytes] | None = None,
            ir_out: Path | None = None) -> str:
    """Assembly of `bitcode` for `arch` after ROCm LLVM's O3 pipeline and code generation
    (`ir_out`: also write the optimised IR there)."""
    lib = _load()
    argv = [b"rocm_llvm_codegen", *LLVM_OPTIONS, *(options or [])]
    lib.LLVMParseCommandLineOptions(len(argv), (ctypes.c_char_p * len(argv))(*argv), None)
    ctx = lib.LLVMContextCreate()
    buf = lib.LLVMCreateMemoryBufferWithMemoryRangeCopy(bitcode, len(bitcode), b"input.bc")
    module = ctypes.c_void_p()
    if lib.LLVMParseBitcodeInContext2(ctx, buf, ctypes.byref(module)):
        raise RuntimeError("ROCm LLVM could not read the bitcode")
    target, err = ctypes.c_void_p(), ctypes.c_char_p()
    if lib.LLVMGetTargetFromTriple(TRIPLE, ctypes.byref(target), ctypes.byref(err)):
        raise RuntimeError(f"no AMDGPU target in ROCm LLVM: {err.value!r}")
    # LLVMCodeGenLevelAggressive = 3, LLVMRelocPIC = 2, LLVMCodeModelDefault = 0
    tm = lib.LLVMCreateTargetMachine(target, TRIPLE, arch.encode(), b"", 3, 2, 0)
    lib.LLVMSetTargetMachineAsmVerbosity(tm, 1)  # the "; NumVgprs:" resource comments
    layout = lib.LLVMCreateTargetDataLayout(tm)
    rep = lib.LLVMCopyStringRepOfTargetData(layout)
    lib.LLVMSetDataLayout(module, ctypes.cast(rep, ctypes.c_char_p).value)
    lib.LLVMSetTarget(module, TRIPLE)
    fn = lib.LLVMGetFirstFunction(module)
    while fn:
        # LLVMAttributeFunctionIndex = ~0u: drop the front end's target, take --arch's.
        for attr in (b"target-cpu", b"target-features"):
            lib.LLVMRemoveStringAttributeAtIndex(fn, 0xFFFFFFFF, attr, len(attr))
        lib.LLVMAddTargetDependentFunctionAttr(fn, b"target-cpu", arch.encode())
        fn = lib.LLVMGetNextFunction(fn)
    # clang -O3's pipeline tuning: loop interleaving, loop and SLP vectorisation, unrolling.
    opts = lib.LLVMCreatePassBuilderOptions()
    for name in ("LoopInterleaving", "LoopVectorization", "SLPVectorization", "LoopUnrolling"):
        getattr(lib, f"LLVMPassBuilderOptionsSet{name}")(opts, 1)
    error = lib.LLVMRunPasses(module, b"default<O3>", tm, opts)
    if error:
        msg = ctypes.cast(lib.LLVMGetErrorMessage(error), ctypes.c_char_p).value
        raise RuntimeError(f"ROCm LLVM O3 pipeline failed: {msg!r}")
    if ir_out is not None:
        ir_out.write_bytes(ctypes.string_at(lib.LLVMPrintModuleToString(module)))
    out, err = ctypes.c_void_p(), ctypes.c_char_p()
    # LLVMAssemblyFile = 0
    if lib.LLVMTargetMachineEmitToMemoryBuffer(tm, module, 0, ctypes.byref(err), ctypes.byref(out)):
        raise RuntimeError(f"ROCm LLVM code generation failed: {err.value!r}")
    return ctypes.string_at(lib.LLVMGetBufferStart(out), lib.LLVMGetBufferSize(out)).decode()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bitcode", type=Path)
    parser.add_argument("--arch", required=True, help="gfx942, gfx950, ...")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--ir", type=Path, help="also write the optimised LLVM IR here")
    args = parser.parse_args(argv)
    args.output.write_text(codegen(args.bitcode.read_bytes(), args.arch, ir_out=args.ir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
