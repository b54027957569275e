"""Build and drive the CPU emulation of the HIP kernels (tests/emu/, tests/test_emu_*.py).

The fixtures ``lib`` (the library at 64 and 32 lanes) and ``one_torch_thread`` are in
tests/conftest.py.

The kernels under hip_src/ are compiled for the host against tests/emu/hip_cpu_runtime.h (a
HIP device API whose threads are fibers grouped in 64- or 32-lane waves) into one shared
library per configuration, cached under build/emu/ by a hash of every source and flag, and
called through ctypes with CPU tensors. The small-seq and THD kernels go through the project's
own launchers (dispatch, grid sizing, variant choice), as the extension calls them.

Configurations:
  w64      gfx942 device pass: 64-lane waves, MFMA (the AMD code paths)
  w32      wave32 HIP pass: 32-lane waves, no matrix units (cross-check of the general kernels)
  w64_k32  the self-test kernels compiled with a 32-lane constant but run in 64-lane waves: a
           deliberately broken build, which the tests must catch

Environment: RA_EMU_CXX (compiler, default clang++-19 then clang++), RA_EMU_JOBS (parallel
compiles, default 2), RA_EMU_WORKERS (worker threads per launch, default 2).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

# the bindings' thd_collapse has a Python twin in rocm_attn.thd's kernel wrappers (their fallback
# rule): the same dims merge here as in the real ops
from rocm_attn.thd._kernels import collapse as _collapse  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HIP_SRC = ROOT / "hip_src"
EMU = ROOT / "tests" / "emu"
BUILD = ROOT / "build" / "emu"

sys.path.insert(0, str(ROOT / "tools"))
import generate_kernels  # noqa: E402  (the real build's instantiation template and variant list)

# Small-seq variants compiled per wave width: (direction, dtype, head dim, kv bucket). Every
# head dim and kv bucket runs at 64 lanes in bf16 (the dtype only changes the 16-bit
# conversions, which fp16 exercises at d=128); 32 lanes cross-check every head dim at the
# smallest and largest bucket. The rest of the dispatch table returns hipErrorNotSupported.
SMALL_SEQ_VARIANTS = {
    64: [(d, "bf16", h, kv) for d in ("fwd", "bwd") for h in (64, 128, 256, 512)
         for kv in (4, 8, 16)]
    + [(d, "fp16", 128, kv) for d in ("fwd", "bwd") for kv in (4, 16)],
    32: [(d, "bf16", h, kv) for d in ("fwd", "bwd") for h in (64, 128, 256, 512)
         for kv in (4, 8, 16)],
}

CONFIGS = {
    "w64": dict(wave=64, kernel_wave=64, families=("selftest", "small_seq", "thd")),
    "w32": dict(wave=32, kernel_wave=32, families=("selftest", "small_seq", "thd")),
    "w64_k32": dict(wave=64, kernel_wave=32, families=("selftest",)),
    # the tiled small-seq kernels on their own, so that changing them rebuilds only these
    "tiled_w64": dict(wave=64, kernel_wave=64, families=("selftest", "tiled")),
    "tiled_w32": dict(wave=32, kernel_wave=32, families=("selftest", "tiled")),
}

HIP_SUCCESS = 0
HIP_ERROR_NOT_SUPPORTED = 801
HIP_ERROR_INVALID_VALUE = 1


class EmulationUnavailable(Exception):
    """No compiler that can build the emulation (the tests skip with this reason)."""


def compiler() -> str:
    """The C++ compiler: clang (the kernels use clang's ext_vector_type and _Float16)."""
    env = os.environ.get("RA_EMU_CXX")
    names = [env] if env else ["clang++-19", "clang++"]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise EmulationUnavailable(f"no clang++ found (tried {', '.join(names)}; "
                               "apt-get install clang-19)")


def _flags(cfg: dict) -> List[str]:
    flags = ["-std=c++17", "-O1", "-fPIC", "-g0", "-w", f"-DRA_EMU_WAVE={cfg['wave']}",
             f"-DRA_EMU_KERNEL_WAVE={cfg['kernel_wave']}", f"-I{EMU / 'include'}", f"-I{EMU}",
             f"-I{HIP_SRC}"]
    if cfg["wave"] != cfg["kernel_wave"]:
        flags.append("-DRA_EMU_ALLOW_WAVE_MISMATCH")
    for fam in cfg["families"]:
        flags.append(f"-DRA_EMU_{fam.upper()}")
    return flags


def _small_seq_sources(wave: int, out: Path) -> List[Path]:
    """Instantiation files of the chosen variants (the real build's template, several variants
    per file) and one file of stubs for the rest of the dispatch table."""
    chosen = set(SMALL_SEQ_VARIANTS[wave])
    groups: Dict[Tuple[str, str, int], List[int]] = {}
    for direction, dtype, d, kv in sorted(chosen):
        groups.setdefault((direction, dtype, d), []).append(kv)
    files = []
    for (direction, dtype, d), kvs in groups.items():
        ctype = generate_kernels.DTYPES[dtype]
        text = "".join(generate_kernels.unit_text(direction, ctype, d, kv) for kv in kvs)
        files.append(_write(out / f"small_seq_{direction}_{dtype}_d{d}.cpp", text))
    stubs = ['#include "small_seq/dispatch.h"\n']
    for direction, dtype, d, kv in generate_kernels.small_seq_variants():
        if (direction, dtype, d, kv) in chosen:
            continue
        stubs.append(generate_kernels.stub_text(direction, generate_kernels.DTYPES[dtype], d, kv))
    files.append(_write(out / "small_seq_stubs.cpp", "".join(stubs)))
    files.append(HIP_SRC / "small_seq" / "launch.hip")
    return files


def _write(path: Path, text: str) -> Path:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _sources(cfg: dict, gen: Path) -> List[Path]:
    # every host-side unit of hip_src/common (error counter, device facts, launch tuning); the
    # self-test kernels only where that family is built
    common = sorted(p for p in (HIP_SRC / "common").glob("*.hip") if p.name != "selftest_kernel.hip")
    files = [EMU / "runtime.cpp", EMU / "driver.cpp", EMU / "model_kernels.cpp"] + common
    if "selftest" in cfg["families"]:
        files.append(HIP_SRC / "common" / "selftest_kernel.hip")
    if "small_seq" in cfg["families"]:
        files += _small_seq_sources(cfg["wave"], gen)
    if "thd" in cfg["families"]:
        files += [HIP_SRC / "thd" / name for name in ("copy.hip", "merge.hip", "grad.hip")]
    if "tiled" in cfg["families"]:
        files.append(HIP_SRC / "small_seq" / "tiled_launch.hip")
        files.append(HIP_SRC / "small_seq" / "tiled_bwd_launch.hip")
        files.append(HIP_SRC / "small_seq" / "flash_contract_launch.hip")
    return files


def _digest(cfg: dict, cxx: str) -> str:
    h = hashlib.sha256()
    h.update(repr((cfg, cxx, _flags(cfg), SMALL_SEQ_VARIANTS)).encode())
    for root in (HIP_SRC, EMU):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".h", ".hip", ".cpp") and path.parent.name != "bindings":
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
    h.update(Path(generate_kernels.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())  # the source list and flags live here
    return h.hexdigest()[:16]


_built: Dict[str, Path] = {}
BUILD_SECONDS: Dict[str, float] = {}


def build(name: str) -> Path:
    """Path of configuration `name`'s library, compiled if its sources changed."""
    if name in _built:
        return _built[name]
    cfg = CONFIGS[name]
    cxx = compiler()
    digest = _digest(cfg, cxx)
    out = BUILD / f"{name}-{digest}"
    lib = out / f"libra_emu_{name}.so"
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per configuration at a time
        if not lib.exists():
            start = time.time()
            out.mkdir(parents=True, exist_ok=True)
            gen = out / "gen"
            gen.mkdir(exist_ok=True)
            sources = _sources(cfg, gen)
            flags = _flags(cfg)

            def compile_one(src: Path) -> Path:
                obj = out / (src.parent.name + "_" + src.stem + ".o")
                if not obj.exists():
                    cmd = [cxx, *flags, "-x", "c++", "-c", str(src), "-o", str(obj) + ".tmp"]
                    res = subprocess.run(cmd, capture_output=True, text=True)
                    if res.returncode != 0:
                        raise RuntimeError(f"emulation build failed: {' '.join(cmd)}\n"
                                           f"{res.stderr[-6000:]}")
                    os.replace(str(obj) + ".tmp", obj)
                return obj

            jobs = int(os.environ.get("RA_EMU_JOBS", "2"))
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                objs = list(pool.map(compile_one, sources))
            tmp = str(lib) + ".tmp"
            cmd = [cxx, "-shared", "-o", tmp, *map(str, objs), "-lpthread", "-ldl"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"emulation link failed: {res.stderr[-4000:]}")
            os.replace(tmp, lib)
            BUILD_SECONDS[name] = time.time() - start
    _built[name] = lib
    return lib


# ---------------------------------------------------------------------------------------------
# ctypes mirrors of the parameter structs (checked against offsetof/sizeof from the library)
# ---------------------------------------------------------------------------------------------
P = ctypes.c_void_p
I64 = ctypes.c_int64
I32 = ctypes.c_int32


class SmallSeqParams(ctypes.Structure):
    _fields_ = [(n, P) for n in ("q", "k", "v", "o", "lse", "probs", "dout", "out",
                                 "dlse", "dq",
                                 "dk", "dv", "cu_seqlens_q", "cu_seqlens_kv", "seqlens_kv",
                                 "error_state")] + \
        [(n, I64) for n in ("q_token_stride", "q_head_stride", "k_token_stride", "k_head_stride",
                            "k_batch_stride", "v_token_stride", "v_head_stride", "v_batch_stride",
                            "o_token_stride", "o_head_stride", "do_token_stride", "do_head_stride",
                            "dq_token_stride", "dq_head_stride", "dkv_token_stride",
                            "dkv_head_stride", "dkv_batch_stride")] + \
        [(n, I32) for n in ("batch", "total_q", "total_kv", "num_heads_q", "num_heads_kv",
                            "max_seqlen_kv", "kv_rows_per_batch")] + \
        [("softmax_scale", ctypes.c_float)]


class SmallSeqTiledParams(ctypes.Structure):
    _fields_ = [(n, P) for n in ("q", "k", "v", "o", "lse", "row_max", "probs", "dout", "out",
                                 "dlse", "dq",
                                 "dk", "dv", "cu_seqlens_q", "cu_seqlens_kv", "seqlens_kv")] + \
        [(n, ctypes.c_bool) for n in ("cu_seqlens_q_int64", "cu_seqlens_kv_int64",
                                      "seqlens_kv_int64")] + \
        [("error_state", P)] + \
        [(f"{t}_{s}_stride", I64) for t in ("q", "k", "v", "o", "out", "do", "dq", "dk", "dv")
         for s in ("batch", "token", "head")] + \
        [("lse_head_stride", I64), ("dlse_head_stride", I64)] + \
        [(n, I32) for n in ("batch", "total_q", "total_kv", "num_heads_q", "num_heads_kv",
                            "max_seqlen_q", "max_seqlen_kv", "s_q", "s_kv")] + \
        [("softmax_scale", ctypes.c_float), ("workspace", P), ("workspace_elems", I64),
         ("work_queue", P)]


class ThdRowMapParams(ctypes.Structure):
    _fields_ = [("kind", I32), ("b", I32), ("cu", P), ("cu_dst", P), ("cu_src", P), ("cp", I32),
                ("rank", I32), ("half", I32), ("local_rows", I64), ("src_rows", I64),
                ("index", P), ("step_index", P), ("step_count", I64)]


class ThdCopyParams(ctypes.Structure):
    _fields_ = [("src", P), ("dst", P), ("map", ThdRowMapParams), ("rows", I64), ("outer", I64),
                ("src_outer_stride", I64), ("dst_outer_stride", I64), ("src_row_stride", I64),
                ("dst_row_stride", I64), ("src_head_stride", I64), ("dst_head_stride", I64),
                ("heads", I32), ("head_bytes", I32), ("fill", I32),
                ("fill_bytes", ctypes.c_uint32 * 4)]


class ThdMergeParams(ctypes.Structure):
    _fields_ = [("out", P), ("lse", P), ("out_step", P), ("lse_step", P), ("out_dst", P),
                ("lse_dst", P)] + \
        [(n, I64) for n in ("out_tok", "out_head", "step_tok", "step_head", "dst_tok", "dst_head",
                            "lse_head", "lse_tok", "lse_step_head", "lse_step_tok",
                            "lse_dst_head", "lse_dst_tok", "n")] + \
        [(n, I32) for n in ("heads", "dim", "out_dtype", "step_dtype", "correction",
                            "copy_first_half")] + [("map", ThdRowMapParams)]


class ThdGradParams(ctypes.Structure):
    _fields_ = [("grad", P), ("step", P), ("dst", P)] + \
        [(n, I64) for n in ("grad_tok", "grad_head", "step_tok", "step_head", "dst_tok",
                            "dst_head", "n")] + \
        [(n, I32) for n in ("heads", "head_dim", "grad_dtype", "step_dtype", "op0", "op1",
                            "step_is_half", "copy_none")] + [("map", ThdRowMapParams)]


STRUCTS = {c.__name__: c for c in (SmallSeqParams, SmallSeqTiledParams, ThdRowMapParams, ThdCopyParams,
                                    ThdMergeParams, ThdGradParams)}


def ptr(t: Optional[torch.Tensor]):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


class Emu:
    """One loaded configuration."""

    def __init__(self, name: str):
        self.name = name
        self.lib = ctypes.CDLL(str(build(name)))
        L = self.lib
        L.ra_emu_last_message.restype = ctypes.c_char_p
        L.emu_layout.restype = ctypes.c_char_p
        L.emu_error_state_ptr.restype = ctypes.c_void_p
        L.ra_emu_kernels_run.restype = ctypes.c_char_p
        L.ra_emu_kernels_run.argtypes = [ctypes.c_int]
        self.wave = L.ra_emu_wave()
        self.kernel_wave = L.emu_kernel_wave()
        self.has_mma = bool(L.emu_has_mma())
        self.check_layout()
        # the launch tuning values this library loaded with (tuning.h defaults and environment)
        self.tuning_defaults = {name: self._set_tuning(name, 0) for name in tuning_names()}
        for name, value in self.tuning_defaults.items():
            self._set_tuning(name, value)

    def _set_tuning(self, name: str, value: int) -> int:
        old = self.lib.emu_set_tuning(name.encode(), int(value))
        assert old != -2**31, f"unknown tuning name {name}"
        return old

    def apply_tuning(self):
        """Before a launch: the library's tuning values are its defaults with the overrides of
        tuning() on top, as rocm_attn.tuning.override gives the real extension."""
        for name, value in self.tuning_defaults.items():
            self._set_tuning(name, TUNING.get(name, value))

    def check_layout(self):
        """Every offset and size the library reports matches the ctypes mirror."""
        for item in self.lib.emu_layout().decode().strip(";").split(";"):
            name, value = item.split(":")
            if "." in name:
                struct, field = name.split(".")
                got = getattr(STRUCTS[struct], field).offset
            else:
                got = ctypes.sizeof(STRUCTS[name])
            assert got == int(value), f"ctypes mirror of {name}: {got} != {value}"

    def kernels_run(self, since_mark: bool = False) -> List[str]:
        """Names of the kernels this library has launched since it was loaded (demangled, or
        the launch site's expression for kernels without a dynamic symbol); since_mark: only
        those launched since the last mark_kernels() (the list of the whole run stays whole:
        test_emu_thd.py reads it at the end)."""
        return self.lib.ra_emu_kernels_run(int(since_mark)).decode().split("\n")[:-1]

    def mark_kernels(self) -> None:
        """Start a new list for kernels_run(since_mark=True)."""
        self.lib.ra_emu_kernels_mark()

    def message(self) -> str:
        return self.lib.ra_emu_last_message().decode()

    def stats(self, reset=False) -> Dict[str, int]:
        out = (ctypes.c_int64 * 4)()
        self.lib.ra_emu_stats(out, int(reset))
        return dict(zip(("inactive_reads", "exchanges", "barriers", "launches"), out))

    def check(self, rc: int, what: str):
        assert rc == HIP_SUCCESS, f"{what}: hip error {rc} ({self.message()})"

    def errors(self, reset=True) -> Tuple[int, int]:
        out = (ctypes.c_int32 * 2)()
        self.check(self.lib.emu_error_state_read(out, int(reset)), "error state read")
        return out[0], out[1]


_loaded: Dict[str, Emu] = {}

# Launch tuning overrides (names of hip_src/common/tuning.h) applied to every library before
# each launch; set through tuning().
TUNING: Dict[str, int] = {}


def tuning_names() -> List[str]:
    text = (HIP_SRC / "common" / "tuning.h").read_text()
    return re.findall(r'\{"(\w+)", "ROCM_ATTN_\w+", &RaTuning::\w+\}', text)


@contextlib.contextmanager
def tuning(**values: int):
    """Launch tuning values for the emulated launches inside the block (rocm_attn.tuning's
    override, for the emulation libraries)."""
    unknown = set(values) - set(tuning_names())
    assert not unknown, f"unknown tuning names {sorted(unknown)}"
    saved = dict(TUNING)
    TUNING.update(values)
    try:
        yield
    finally:
        TUNING.clear()
        TUNING.update(saved)


def load(name: str) -> Emu:
    if name not in _loaded:
        _loaded[name] = Emu(name)
    return _loaded[name]


def emu_or_skip(name: str) -> Emu:
    """The loaded configuration, or pytest.skip when no compiler can build it."""
    import pytest

    try:
        return load(name)
    except EmulationUnavailable as e:
        pytest.skip(f"CPU emulation unavailable: {e}")


# ---------------------------------------------------------------------------------------------
# small-seq: the launchers of hip_src/small_seq/launch.hip with host tensors (params filled as
# hip_src/bindings/small_seq.cpp make_params does)
# ---------------------------------------------------------------------------------------------
def kv_bucket(max_kv: int) -> int:
    return 4 if max_kv <= 4 else (8 if max_kv <= 8 else 16)


def small_seq_compiled(wave: int, direction: str, dtype: torch.dtype, d: int, max_kv: int) -> bool:
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    return (direction, name, d, kv_bucket(max_kv)) in SMALL_SEQ_VARIANTS[wave]


def _nan(shape, dtype):
    return torch.full(tuple(shape), float("nan"), dtype=dtype)


def small_seq_params(lib: Emu, q, k, v, cu_q, cu_kv, seqlens, max_kv, scale) -> SmallSeqParams:
    p = SmallSeqParams()
    thd = q.dim() == 3
    p.num_heads_q, p.num_heads_kv = q.shape[-2], k.shape[-2]
    p.q_head_stride, p.k_head_stride, p.v_head_stride = q.stride(-2), k.stride(-2), v.stride(-2)
    p.max_seqlen_kv = max_kv
    p.softmax_scale = scale
    if thd:
        p.batch = cu_q.numel() - 1
        p.cu_seqlens_q, p.cu_seqlens_kv = ptr(cu_q), ptr(cu_kv)
        p.total_q, p.total_kv = q.shape[0], k.shape[0]
        p.q_token_stride, p.k_token_stride, p.v_token_stride = q.stride(0), k.stride(0), v.stride(0)
    else:
        p.batch = q.shape[0]
        p.seqlens_kv = ptr(seqlens)
        p.total_q, p.total_kv, p.kv_rows_per_batch = p.batch, k.shape[1], k.shape[1]
        p.q_token_stride, p.k_token_stride, p.v_token_stride = q.stride(0), k.stride(1), v.stride(1)
        p.k_batch_stride, p.v_batch_stride = k.stride(0), v.stride(0)
    p.q, p.k, p.v = ptr(q), ptr(k), ptr(v)
    p.error_state = lib.lib.emu_error_state_ptr()
    return p


def _run_plan(lib: Emu, launcher, p, q, plan, what: str, rc=None, *extra) -> None:
    """Run an emulated launcher taking (params, is_bf16, head dim, plan ints, their count,
    *extra) on ``plan``; rc: a list that takes the launcher's code instead of raising on an
    error (``what`` names the call in the raised message)."""
    ints = (ctypes.c_int64 * len(plan))(*plan)
    code = launcher(ctypes.byref(p), int(q.dtype == torch.bfloat16), q.shape[-1], ints,
                    ctypes.c_int64(len(plan)), *extra)
    if rc is not None:
        rc.append(code)
    else:
        lib.check(code, what)


def small_seq_fwd(lib: Emu, q, k, v, cu_q, cu_kv, seqlens, max_kv, scale, return_softmax=True,
                  plan=None, rc=None, row_max=False):
    """(out, lse, probs) of the emulated forward; outputs start as NaN (unwritten shows).
    plan: the launcher's plan ints (default: the plan's, one_query_plan); rc: a list that takes
    the launcher's return code instead of raising on an error; ``row_max``: also each row's
    maximum scaled logit ``[h_q, b]`` (params.h small_seq_fwd_launch's row_max), last."""
    p = small_seq_params(lib, q, k, v, cu_q, cu_kv, seqlens, max_kv, scale)
    out = _nan(q.shape, q.dtype)
    lse = _nan((p.num_heads_q, p.batch), torch.float32)
    probs = _nan((p.batch, p.num_heads_q, max_kv), torch.float32)
    p.o, p.o_token_stride, p.o_head_stride = ptr(out), out.stride(0), out.stride(-2)
    p.lse = ptr(lse)
    p.probs = ptr(probs) if return_softmax else None
    rmax = _nan((p.num_heads_q, p.batch), torch.float32) if row_max else None
    lib.apply_tuning()
    if plan is None:
        plan = one_query_plan(lib, q, k, max_kv, "forward")
    _run_plan(lib, lib.lib.emu_small_seq_fwd, p, q, plan, "small_seq forward", rc, ptr(rmax))
    return (out, lse, probs) + ((rmax,) if row_max else ())


def one_query_plan(lib: Emu, q, k, max_kv, direction: str) -> List[int]:
    """The plan ints of an emulated one-query launch (rocm_attn.small_seq_plan.one_query_plans',
    for the emulated device and tuning())."""
    from rocm_attn import small_seq_plan as sp

    call = sp.Call(q.shape[-1], q.shape[-2], k.shape[-2], 1, max_kv)
    fwd, bwd = sp.one_query_ints(call, plan_device(lib), plan_tuning(lib))
    return list(fwd if direction == "forward" else bwd)


def small_seq_bwd(lib: Emu, dout, q, k, v, out, lse, dlse, cu_q, cu_kv, seqlens, max_kv, scale,
                  plan=None, rc=None):
    """(dq, dk, dv) of the emulated backward; outputs start as NaN. plan, rc: as
    small_seq_fwd's."""
    p = small_seq_params(lib, q, k, v, cu_q, cu_kv, seqlens, max_kv, scale)
    dq, dk, dv = _nan(q.shape, q.dtype), _nan(k.shape, k.dtype), _nan(v.shape, v.dtype)
    p.dout, p.out, p.lse, p.dlse = ptr(dout), ptr(out), ptr(lse), ptr(dlse)
    p.dq, p.dk, p.dv = ptr(dq), ptr(dk), ptr(dv)
    p.do_token_stride, p.do_head_stride = dout.stride(0), dout.stride(-2)
    p.o_token_stride, p.o_head_stride = out.stride(0), out.stride(-2)
    p.dq_token_stride, p.dq_head_stride = dq.stride(0), dq.stride(-2)
    p.dkv_head_stride = dk.stride(-2)
    p.dkv_token_stride = dk.stride(0) if q.dim() == 3 else dk.stride(1)
    p.dkv_batch_stride = 0 if q.dim() == 3 else dk.stride(0)
    lib.apply_tuning()
    if plan is None:
        plan = one_query_plan(lib, q, k, max_kv, "backward")
    _run_plan(lib, lib.lib.emu_small_seq_bwd, p, q, plan, "small_seq backward", rc)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# THD: the torch.ops.rocm_attn.thd_* ops of hip_src/bindings/thd_*.cpp, ported line by line to
# Python over the emulated launchers (thd/copy.hip, thd/merge.hip, thd/grad.hip), so that
# rocm_attn.thd's own kernel wrappers (_kernel_partition, ...) run unchanged on CPU tensors.
# ---------------------------------------------------------------------------------------------
THD_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
THD_MAP = {"partition": 0, "to_contiguous": 1, "to_rank_sharded": 2, "half": 3, "copy_valid": 4,
           "identity": 5, "index": 6}


def _split_rows(ts, begin):
    """thd_split_rows: (heads, head_elems, head stride of each tensor)."""
    nd = ts[0].dim()
    s = begin
    while s < nd:
        if all((c := _collapse(t, s, nd)) is not None and (c[0] == 1 or c[1] == 1) for t in ts):
            break
        s += 1
    head_elems = _collapse(ts[0], s, nd)[0]
    strides, heads = [], 1
    for t in ts:
        c = _collapse(t, begin, s)
        assert c is not None, "thd: rows must be [heads, contiguous elements]"
        heads = c[0]
        strides.append(c[1])
    return heads, head_elems, strides


def _empty(shape, dtype):
    """A new tensor of 0xFF bytes (NaN in every float dtype): an unwritten element shows."""
    t = torch.empty(tuple(shape), dtype=dtype)
    t.view(torch.uint8).fill_(0xFF) if t.numel() else None
    return t


def _map(kind, cu=None):
    m = ThdRowMapParams()
    m.kind = THD_MAP[kind]
    m.cp = 1
    if cu is not None:
        m.cu = m.cu_dst = m.cu_src = ptr(cu)
        m.b = cu.numel() - 1
    return m


class EmuThdOps:
    """Stands in for torch.ops.rocm_attn in rocm_attn.thd's kernel wrappers."""

    def __init__(self, lib: Emu):
        self.lib = lib
        self.keep = []  # tensors a params struct points at, alive until the launch returns

    def _run(self, fn, p, what):
        self.lib.apply_tuning()
        self.lib.check(fn(ctypes.byref(p)), what)
        self.keep.clear()

    def _copy_params(self, src, dst, dim):
        es = dst.element_size()
        p = ThdCopyParams()
        so = _collapse(src, 0, dim)
        do = _collapse(dst, 0, dim)
        heads, elems, hs = _split_rows([src, dst], dim + 1)
        p.src, p.dst = ptr(src), ptr(dst)
        p.rows = dst.shape[dim]
        p.outer = so[0]
        p.src_outer_stride, p.dst_outer_stride = so[1] * es, do[1] * es
        p.src_row_stride, p.dst_row_stride = src.stride(dim) * es, dst.stride(dim) * es
        p.heads, p.head_bytes = heads, elems * es
        p.src_head_stride, p.dst_head_stride = hs[0] * es, hs[1] * es
        return p

    def thd_gather(self, x, cu, mode, cp, rank, dim):
        dim = dim % x.dim()
        total = x.shape[dim]
        rows = total // cp if mode == 0 else (total // 2 if mode == 3 else total)
        shape = list(x.shape)
        shape[dim] = rows
        out = _empty(shape, x.dtype)
        if out.numel() == 0:
            return out
        p = self._copy_params(x, out, dim)
        p.map = _map(list(THD_MAP)[mode], cu)
        p.map.cp = cp
        p.map.rank = rank if mode == 0 else 0
        p.map.half = rank if mode == 3 else 0
        p.map.local_rows = total if mode == 3 else total // cp
        self._run(self.lib.lib.emu_thd_copy_rows, p, "thd gather")
        return out

    def thd_copy_valid_tokens_(self, dst, src, cu, cu_dst, cu_src, dim, fill):
        dim = dim % dst.dim()
        p = self._copy_params(src, dst, dim)
        if dst.numel() == 0:
            return
        p.map = _map("copy_valid", cu)
        if cu_dst is not None:
            p.map.cu_dst = ptr(cu_dst)
        if cu_src is not None:
            p.map.cu_src = ptr(cu_src)
        p.map.local_rows = dst.shape[dim]  # cu_dst is clamped into dst's rows (index.h)
        p.map.src_rows = src.shape[dim]
        if fill is not None:
            p.fill = 1
            raw = torch.full((16 // dst.element_size(),), fill, dtype=dst.dtype)
            for i, w in enumerate(raw.view(torch.int32).tolist()):
                p.fill_bytes[i] = w & 0xFFFFFFFF
        self._run(self.lib.lib.emu_thd_copy_rows, p, "thd copy_valid_tokens")

    @staticmethod
    def _out_view(o, nh):
        h, head = _collapse(o, 1, 1 + nh)
        return o.stride(0), head

    def _merge_params(self, out, lse, out_step, lse_step, cu, only_second_half, correction,
                      rows=None, step_rows=None):
        p = ThdMergeParams()
        h, p.lse_head = _collapse(lse, 0, lse.dim() - 1)
        p.lse_tok = lse.stride(-1)
        _, p.lse_step_head = _collapse(lse_step, 0, lse_step.dim() - 1)
        p.lse_step_tok = lse_step.stride(-1)
        t, step_tokens = lse.shape[-1], lse_step.shape[-1]
        p.n = rows.numel() if rows is not None else step_tokens
        p.heads = h
        p.lse, p.lse_step = ptr(lse), ptr(lse_step)
        if out is not None:
            nh = lse.dim() - 1
            p.out_tok, p.out_head = self._out_view(out, nh)
            p.step_tok, p.step_head = self._out_view(out_step, nh)
            p.dim = _collapse(out, 1 + nh, out.dim())[0]
            p.out, p.out_step = ptr(out), ptr(out_step)
            p.out_dtype, p.step_dtype = THD_DTYPES[out.dtype], THD_DTYPES[out_step.dtype]
        p.correction = int(correction)
        if rows is not None:
            p.map = _map("index")
            p.map.index = ptr(rows)
            p.map.local_rows = t
            if step_rows is not None:
                p.map.step_index = ptr(step_rows)
                p.map.step_count = step_tokens
        elif only_second_half:
            p.map = _map("half", cu)
            p.map.local_rows = t
            p.map.half = 1
        else:
            p.map = _map("identity")
        return p

    def thd_merge(self, out, lse, out_step, lse_step, cu, only_second_half, correction):
        p = self._merge_params(out, lse, out_step, lse_step, cu, only_second_half, correction)
        new_out = _empty(out.shape, out.dtype) if out is not None else torch.empty(0)
        new_lse = torch.empty(0) if correction else _empty(lse.shape, lse.dtype)
        if out is not None and new_out.numel() > 0:
            p.dst_tok, p.dst_head = self._out_view(new_out, lse.dim() - 1)
            p.out_dst = ptr(new_out)
        if not correction:
            _, p.lse_dst_head = _collapse(new_lse, 0, new_lse.dim() - 1)
            p.lse_dst_tok = new_lse.stride(-1)
            p.lse_dst = ptr(new_lse)
        p.copy_first_half = int(only_second_half)
        if p.out_dst or p.lse_dst:
            self._run(self.lib.lib.emu_thd_merge, p, "thd merge")
        return new_out, new_lse

    @staticmethod
    def _in_place(p, out, lse):
        if out is not None and out.numel() > 0:
            p.out_dst, p.dst_tok, p.dst_head = ptr(out), p.out_tok, p.out_head
        p.lse_dst, p.lse_dst_head, p.lse_dst_tok = ptr(lse), p.lse_head, p.lse_tok

    def thd_merge_(self, out, lse, out_step, lse_step, cu, only_second_half):
        p = self._merge_params(out, lse, out_step, lse_step, cu, only_second_half, False)
        self._in_place(p, out, lse)
        self._run(self.lib.lib.emu_thd_merge, p, "thd merge (in place)")

    def thd_merge_rows_(self, out, lse, out_step, lse_step, rows, step_rows):
        p = self._merge_params(out, lse, out_step, lse_step, None, False, False, rows, step_rows)
        self._in_place(p, out, lse)
        self._run(self.lib.lib.emu_thd_merge, p, "thd merge_rows (in place)")

    def thd_out_correction_(self, out, out_step, lse, lse_step, cu, only_second_half):
        p = self._merge_params(out, lse, out_step, lse_step, cu, only_second_half, True)
        if out.numel() == 0:
            return
        p.out_dst, p.dst_tok, p.dst_head = ptr(out), p.out_tok, p.out_head
        self._run(self.lib.lib.emu_thd_merge, p, "thd out_correction (in place)")

    def _grad_rows(self, grad, step, dst):
        p = ThdGradParams()
        heads, head_dim, hs = _split_rows([grad, step, dst], 1)
        p.grad, p.step, p.dst = ptr(grad), ptr(step), ptr(dst)
        p.grad_tok, p.step_tok, p.dst_tok = grad.stride(0), step.stride(0), dst.stride(0)
        p.grad_head, p.step_head, p.dst_head = hs
        p.heads, p.head_dim = heads, head_dim
        p.grad_dtype, p.step_dtype = THD_DTYPES[grad.dtype], THD_DTYPES[step.dtype]
        return p

    def _grad_params(self, grad, grad_step, cu, op0, op1, dst):
        t, ts = grad.shape[0], grad_step.shape[0]
        full = ts == t
        p = self._grad_rows(grad, grad_step, dst)
        p.op0, p.op1 = op0, op1
        p.step_is_half = 0 if full else 1
        if full and op0 == op1:
            p.map = _map("identity")
            p.n = t
        else:
            p.map = _map("half", cu)
            p.map.local_rows = t
            p.n = t // 2
        return p

    def thd_grad_correction(self, grad, grad_step, cu, op0, op1):
        dst = _empty(grad.shape, grad.dtype)
        if dst.numel() == 0:
            return dst
        p = self._grad_params(grad, grad_step, cu, op0, op1, dst)
        p.copy_none = 1
        self._run(self.lib.lib.emu_thd_grad, p, "thd grad_correction")
        return dst

    def thd_grad_correction_(self, grad, grad_step, cu, op0, op1):
        if grad.numel() == 0:
            return
        p = self._grad_params(grad, grad_step, cu, op0, op1, grad)
        self._run(self.lib.lib.emu_thd_grad, p, "thd grad_correction (in place)")

    def thd_add_rows_(self, grad, step, rows, step_rows):
        n = rows.numel()
        if grad.numel() == 0 or n == 0:
            return
        p = self._grad_rows(grad, step, grad)
        p.op0 = p.op1 = 2
        p.map = _map("index")
        p.map.index = ptr(rows)
        p.map.local_rows = grad.shape[0]
        if step_rows is not None:
            p.map.step_index = ptr(step_rows)
            p.map.step_count = step.shape[0]
        p.n = n
        self._run(self.lib.lib.emu_thd_grad, p, "thd add_rows (in place)")


# ---------------------------------------------------------------------------------------------
# tiled small-seq: the launcher of hip_src/small_seq/tiled_launch.hip with host tensors (params
# filled as hip_src/bindings/small_seq_tiled.cpp fills them)
# ---------------------------------------------------------------------------------------------
def small_seq_tiled_params(lib: Emu, q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv,
                           scale) -> SmallSeqTiledParams:
    p = SmallSeqTiledParams()
    p.num_heads_q, p.num_heads_kv = q.shape[-2], k.shape[-2]
    p.max_seqlen_q, p.max_seqlen_kv = max_q, max_kv
    p.softmax_scale = scale
    if cu_q is not None:  # THD q [total_q, h, d]
        p.batch = cu_q.numel() - 1
        p.cu_seqlens_q, p.cu_seqlens_q_int64 = ptr(cu_q), cu_q.dtype == torch.int64
        p.total_q = q.shape[0]
        p.q_token_stride, p.q_head_stride = q.stride(0), q.stride(1)
    else:  # BSHD q [b, s_q, h, d]
        p.batch = q.shape[0]
        p.s_q = q.shape[1]
        p.total_q = q.shape[0] * q.shape[1]
        p.q_batch_stride, p.q_token_stride, p.q_head_stride = q.stride(0), q.stride(1), q.stride(2)
    if cu_kv is not None:  # THD k/v [total_kv, h, d]
        p.cu_seqlens_kv, p.cu_seqlens_kv_int64 = ptr(cu_kv), cu_kv.dtype == torch.int64
        p.total_kv = k.shape[0]
        p.k_token_stride, p.k_head_stride = k.stride(0), k.stride(1)
        p.v_token_stride, p.v_head_stride = v.stride(0), v.stride(1)
    else:  # BSHD k/v [b, s_kv, h, d]
        p.seqlens_kv, p.seqlens_kv_int64 = ptr(seqlens), seqlens.dtype == torch.int64
        p.total_kv = p.s_kv = k.shape[1]
        p.k_batch_stride, p.k_token_stride, p.k_head_stride = k.stride(0), k.stride(1), k.stride(2)
        p.v_batch_stride, p.v_token_stride, p.v_head_stride = v.stride(0), v.stride(1), v.stride(2)
    p.lse_head_stride = p.total_q
    p.q, p.k, p.v = ptr(q), ptr(k), ptr(v)
    p.error_state = lib.lib.emu_error_state_ptr()
    return p


def small_seq_tiled_fwd(lib: Emu, q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale,
                        return_softmax=True, row_max=False, plan=None, rc=None):
    """(out, lse, probs) of the emulated tiled forward; outputs start as NaN (unwritten shows).
    lse [h_q, total_q], probs [total_q, h_q, max_kv] (total_q = b * s_q for BSHD q).
    ``row_max``: also each row's maximum scaled logit, indexed as lse (tiled_params.h), last.
    plan: the launcher's plan ints (default: the plan's, tiled_fwd_plan); rc: a list that takes
    the launcher's code instead of raising on an error (as small_seq_fwd)."""
    p = small_seq_tiled_params(lib, q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale)
    out = _nan(q.shape, q.dtype)
    lse = _nan((p.num_heads_q, p.total_q), torch.float32)
    probs = _nan((p.total_q, p.num_heads_q, max_kv), torch.float32)
    p.o = ptr(out)
    if q.dim() == 3:
        p.o_token_stride, p.o_head_stride = out.stride(0), out.stride(1)
    else:
        p.o_batch_stride, p.o_token_stride, p.o_head_stride = out.stride(0), out.stride(1), out.stride(2)
    p.lse = ptr(lse)
    p.probs = ptr(probs) if return_softmax else None
    rmax = _nan((p.num_heads_q, p.total_q), torch.float32) if row_max else None
    p.row_max = ptr(rmax)
    lib.apply_tuning()
    if plan is None:
        plan = tiled_fwd_plan(lib, q, k, max_q, max_kv, return_softmax, max_logit=row_max)
    _run_plan(lib, lib.lib.emu_small_seq_tiled_fwd, p, q, plan, "small_seq tiled forward", rc)
    return (out, lse, probs) + ((rmax,) if row_max else ())


def plan_device(lib: Emu):
    """The emulated device as the kernel plan sees it (rocm_attn/small_seq_plan.py): the
    library's wave width, the runtime's shared memory (tests/emu/runtime.cpp), a HIP build."""
    from rocm_attn import small_seq_plan

    mps = int(os.environ.get("RA_EMU_MULTIPROCESSORS", "2"))
    return small_seq_plan.Device("emu", "amd", lib.wave, mps, 64 * 1024, 64 * 1024)


def plan_tuning(lib: Emu) -> Dict[str, int]:
    """The plan's tuning for an emulated launch: the library's values with tuning()'s overrides
    (what apply_tuning gives its launchers)."""
    from rocm_attn import small_seq_plan

    values = dict(small_seq_plan.DEFAULT_TUNING)
    for name in values:
        values[name] = TUNING.get(name, lib.tuning_defaults.get(name, values[name]))
    return values


def tiled_bwd_plan(lib: Emu, q, k, max_q, max_kv) -> List[int]:
    """The plan ints of an emulated tiled backward (rocm_attn.small_seq_plan.tiled_bwd_plan's,
    for the emulated device)."""
    from rocm_attn import small_seq_plan as sp

    call = sp.Call(q.shape[-1], q.shape[-2], k.shape[-2], max_q, max_kv)
    return sp.tiled_bwd_ints(call, plan_device(lib), plan_tuning(lib))


def tiled_fwd_plan(lib: Emu, q, k, max_q, max_kv, return_softmax,
                   max_logit=False) -> List[int]:
    """The plan ints of an emulated tiled forward (rocm_attn.small_seq_plan.tiled_fwd_plan's,
    for the emulated device; ``max_logit``: a call that writes row_max, the ROW_MAX
    instances)."""
    from rocm_attn import small_seq_plan as sp

    call = sp.Call(q.shape[-1], q.shape[-2], k.shape[-2], max_q, max_kv,
                   return_softmax=return_softmax, max_logit=max_logit)
    return sp.tiled_fwd_ints(call, plan_device(lib), plan_tuning(lib))


def small_seq_tiled_bwd(lib: Emu, dout, q, k, v, out, lse, dlse, cu_q, cu_kv, seqlens, max_q,
                        max_kv, scale):
    """(dq, dk, dv) of the emulated tiled backward, params filled as
    hip_src/bindings/small_seq_tiled_bwd.cpp fills them; outputs start as NaN (unwritten shows).
    lse / dlse: [h_q, total_q] float32 (dlse may be None)."""
    p = small_seq_tiled_params(lib, q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale)
    dq, dk, dv = _nan(q.shape, q.dtype), _nan(k.shape, k.dtype), _nan(k.shape, k.dtype)
    workspace = _nan((p.num_heads_q * p.total_q,), torch.float32)
    lse = lse.contiguous()
    p.lse, p.lse_head_stride = ptr(lse), lse.stride(0)
    if dlse is not None:
        dlse = dlse.contiguous()
        p.dlse, p.dlse_head_stride = ptr(dlse), dlse.stride(0)
    p.dout, p.out, p.dq, p.dk, p.dv = ptr(dout), ptr(out), ptr(dq), ptr(dk), ptr(dv)
    p.workspace, p.workspace_elems = ptr(workspace), workspace.numel()
    lead = [] if q.dim() == 3 else ["batch"]
    for name, t in (("do", dout), ("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        for dim, s in zip(lead + ["token", "head"], t.stride()[:-1]):
            setattr(p, f"{name}_{dim}_stride", s)
    lib.apply_tuning()
    plan = tiled_bwd_plan(lib, q, k, max_q, max_kv)
    _run_plan(lib, lib.lib.emu_small_seq_tiled_bwd, p, q, plan, "small_seq tiled backward")
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# the flash route's contract kernels (hip_src/small_seq/flash_contract_launch.hip), in place;
# the segment fields filled by small_seq_tiled_params (out / dq stand in for q, dk for k and v:
# the kernels read only their shapes and offsets)
# ---------------------------------------------------------------------------------------------
def small_seq_flash_contract_fwd(lib: Emu, out, lse, k, cu_q, cu_kv, flash_cu_q, flash_cu_kv,
                                 max_q, max_kv) -> None:
    """The forward contract kernel on out [total_q, h_q, d] and lse [h_q, total_q], in place."""
    p = small_seq_tiled_params(lib, out, k, k, cu_q, cu_kv, None, max_q, max_kv, 0.0)
    p.o, p.o_token_stride, p.o_head_stride = ptr(out), out.stride(0), out.stride(1)
    p.lse, p.lse_head_stride = ptr(lse), lse.stride(0)
    lib.check(lib.lib.emu_small_seq_flash_contract_fwd(
        ctypes.byref(p), ptr(flash_cu_q), ptr(flash_cu_kv), int(out.dtype == torch.bfloat16),
        out.shape[-1]), "small_seq flash contract forward")


def small_seq_flash_contract_bwd(lib: Emu, dq, dk, dv, cu_q, cu_kv, flash_cu_q, flash_cu_kv,
                                 max_q, max_kv) -> None:
    """The backward contract kernel on dq, dk, dv, in place."""
    p = small_seq_tiled_params(lib, dq, dk, dk, cu_q, cu_kv, None, max_q, max_kv, 0.0)
    p.dq, p.dk, p.dv = ptr(dq), ptr(dk), ptr(dv)
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(p, f"{name}_token_stride", t.stride(0))
        setattr(p, f"{name}_head_stride", t.stride(1))
    lib.check(lib.lib.emu_small_seq_flash_contract_bwd(
        ctypes.byref(p), ptr(flash_cu_q), ptr(flash_cu_kv), int(dq.dtype == torch.bfloat16),
        dq.shape[-1]), "small_seq flash contract backward")


def small_seq_flash_offsets(lib: Emu, total_q: int, total_kv: int, cu_q, cu_kv) -> torch.Tensor:
    """The route's offsets kernel: int32 [2, b + 1], cu_q / cu_kv clamped into [0, total] and
    made non-decreasing (q rows of a [total_q, 1, 8] tensor, kv rows of [total_kv, 1, 8])."""
    q = torch.zeros(total_q, 1, 8, dtype=torch.bfloat16)
    k = torch.zeros(total_kv, 1, 8, dtype=torch.bfloat16)
    p = small_seq_tiled_params(lib, q, k, k, cu_q, cu_kv, None, 1, 1, 0.0)
    out = torch.full((2, cu_q.numel()), -7, dtype=torch.int32)
    lib.check(lib.lib.emu_small_seq_flash_offsets(ctypes.byref(p), ptr(out)),
              "small_seq flash offsets")
    return out
