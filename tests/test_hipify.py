"""Tests of tools/hipify.py, the HIP -> CUDA source translation (CPU only; nvcc optional)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import hipify  # noqa: E402

from torch.utils.hipify.cuda_to_hip_mappings import CUDA_TO_HIP_MAPPINGS  # noqa: E402

NVCC = os.environ.get("NVCC") or shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH (set NVCC to point at one)")
NVCC_FLAGS = ["-gencode=arch=compute_90,code=sm_90", "--Werror", "all-warnings", "-std=c++17"]


def _hip_value(value: object) -> str:
    return value if isinstance(value, str) else value[0]  # type: ignore[index]


def _table_sources(hip_name: str) -> set[str]:
    """Every CUDA name PyTorch's table maps onto ``hip_name``."""
    return {
        k for table in CUDA_TO_HIP_MAPPINGS for k, v in table.items() if _hip_value(v) == hip_name
    }


# ---------------------------------------------------------------------------------------------
# Token map
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hip, cuda",
    [
        ("hipMalloc", "cudaMalloc"),
        ("hipFree", "cudaFree"),
        ("hipStream_t", "cudaStream_t"),
        ("hipMemcpyAsync", "cudaMemcpyAsync"),
        ("hipMemcpyDeviceToHost", "cudaMemcpyDeviceToHost"),
        ("hipGetLastError", "cudaGetLastError"),
        ("hipSuccess", "cudaSuccess"),
        ("hipError_t", "cudaError_t"),
        ("hipGetErrorString", "cudaGetErrorString"),
        ("hipDeviceProp_t", "cudaDeviceProp"),
        ("hipGetDeviceProperties", "cudaGetDeviceProperties"),
        ("hipGetDevice", "cudaGetDevice"),
        ("hipDeviceSynchronize", "cudaDeviceSynchronize"),
        ("hipFuncSetAttribute", "cudaFuncSetAttribute"),
        ("hipDeviceAttributeWarpSize", "cudaDevAttrWarpSize"),
        ("__HIPCC__", "__CUDACC__"),
    ],
)
def test_runtime_api_names(hip: str, cuda: str) -> None:
    assert hipify.build_token_map()[hip] == cuda
    assert hipify.hipify_source(f"x = {hip};\n") == f"x = {cuda};\n"


def test_runtime_api_in_context() -> None:
    src = textwrap.dedent(
        """\
        hipError_t err = hipMalloc(&p, n);
        hipStream_t stream; hipDeviceProp_t prop; int dev;
        hipGetDevice(&dev); hipGetDeviceProperties(&prop, dev);
        hipMemcpyAsync(dst, src, n, hipMemcpyDeviceToHost, stream);
        if (hipGetLastError() != hipSuccess) puts(hipGetErrorString(err));
        """
    )
    assert hipify.hipify_source(src) == textwrap.dedent(
        """\
        cudaError_t err = cudaMalloc(&p, n);
        cudaStream_t stream; cudaDeviceProp prop; int dev;
        cudaGetDevice(&dev); cudaGetDeviceProperties(&prop, dev);
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream);
        if (cudaGetLastError() != cudaSuccess) puts(cudaGetErrorString(err));
        """
    )


@pytest.mark.parametrize(
    "hip, runtime, other",
    [
        ("hipMalloc", "cudaMalloc", "cuMemAlloc"),  # driver API alias
        ("hipStream_t", "cudaStream_t", "CUstream"),
        ("hipSuccess", "cudaSuccess", "CUDA_SUCCESS"),
        ("hipError_t", "cudaError_t", "CUresult"),
        ("hipGetDeviceProperties", "cudaGetDeviceProperties", "cuDeviceGetProperties"),
    ],
)
def test_prefers_runtime_over_driver_api(hip: str, runtime: str, other: str) -> None:
    # The table really has several sources for this name, so the choice is being exercised.
    assert {runtime, other} <= _table_sources(hip)
    assert hipify.build_token_map()[hip] == runtime


def test_alias_choice_prefers_obvious_name() -> None:
    # hipError_t <- cudaError_t and cudaError, both runtime: the hip->cuda spelling wins, not
    # the shorter alias.
    assert {"cudaError_t", "cudaError"} <= _table_sources("hipError_t")
    assert hipify.build_token_map()["hipError_t"] == "cudaError_t"


def test_tuple_form_table_api_types_and_unsupported() -> None:
    # Older torch stored (hip, conv, api[, HIP_UNSUPPORTED]); the API type decides there.
    conv, driver, runtime, blas, unsup = 3, 37, 38, 39, 47
    table = {
        "cuFooAlloc": ("hipFoo", conv, driver),
        "zzFoo": ("hipFoo", conv, runtime),  # runtime by annotation, whatever its spelling
        "cublasFoo": ("hipFoo", conv, blas),
        "cudaBar": ("hipBar", conv, runtime, unsup),
        "cudaBaz": ("hipBaz", conv, runtime),
        "cudaSame": ("cudaSame", conv, runtime),
    }
    tables = hipify._build_tables([table])
    assert tables.identifiers == {"hipFoo": "zzFoo", "hipBaz": "cudaBaz"}
    assert tables.stats["skipped_unsupported"] == 1
    assert tables.stats["skipped_identity"] == 1


def test_unsafe_entries_are_skipped() -> None:
    ids, headers = hipify.build_token_map(), hipify.build_header_map()
    # nvtxRangeId_t -> int, nvmlDevice_t -> uint32_t, ...: never rewrite C types.
    for name in ("int", "bool", "uint32_t"):
        assert name not in ids
    # Entries written backwards in the table (HIP_CHECK -> CUDA_CHECK) must not invert.
    assert "CUDA_CHECK" not in ids
    assert all("hip" not in cuda.lower() for cuda in ids.values())
    # Qualified names and non-identifiers are not tokens.
    assert all(name.isidentifier() for name in ids)
    assert all("/" in h or h.endswith((".h", ".hpp", ".cuh")) for h in headers)
    # cub::X -> hipcub::X entries are qualified names: not inverted (no hipcub token rewrite).
    assert hipify.hipify_source("hipcub::BlockReduce<float, 256> r;") == (
        "hipcub::BlockReduce<float, 256> r;"
    )


def test_token_map_is_a_fixed_point() -> None:
    ids = hipify.build_token_map()
    assert not set(ids.values()) & set(ids)


def test_map_determinism() -> None:
    first = hipify._build_tables(CUDA_TO_HIP_MAPPINGS)
    second = hipify._build_tables(CUDA_TO_HIP_MAPPINGS)
    assert first == second
    # Independent of table order: reverse the tables and their entries.
    reordered = [dict(reversed(list(t.items()))) for t in reversed(CUDA_TO_HIP_MAPPINGS)]
    third = hipify._build_tables(reordered)
    assert dict(third.identifiers) == dict(first.identifiers)
    assert dict(third.headers) == dict(first.headers)
    assert list(first.identifiers) == sorted(first.identifiers)
    # The public map is cached but hands out copies.
    a = hipify.build_token_map()
    a["hipMalloc"] = "oops"
    assert hipify.build_token_map()["hipMalloc"] == "cudaMalloc"
    assert hipify.build_token_map() == dict(first.identifiers)


def test_map_stats() -> None:
    s = hipify.map_stats()
    assert s["identifiers"] > 2500 and s["identifiers_multi_source"] > 400
    assert s["headers"] > 40 and s["headers_multi_source"] >= 1
    assert s["raw_hip_names"] >= s["identifiers"]


# ---------------------------------------------------------------------------------------------
# Headers and token boundaries
# ---------------------------------------------------------------------------------------------


def test_include_headers() -> None:
    src = textwrap.dedent(
        """\
        #include <hip/hip_runtime.h>
        #include "hip/hip_fp16.h"
        #  include <hip/hip_runtime_api.h>
        #include <hipcub/hipcub.hpp>
        #include "hipMalloc_helpers.h"
        #include "kernels.hip"
        #include <stdint.h>
        const char* s = "hip/hip_runtime.h";
        """
    )
    assert hipify.hipify_source(src) == textwrap.dedent(
        """\
        #include <cuda_runtime.h>
        #include "cuda_fp16.h"
        #  include <cuda_runtime_api.h>
        #include <cub/cub.cuh>
        #include "hipMalloc_helpers.h"
        #include "kernels.cu"
        #include <stdint.h>
        const char* s = "hip/hip_runtime.h";
        """
    )


def test_token_boundaries() -> None:
    src = "hipMallocX(p); my_hipMalloc(p); hipMalloc2(p); p.hipMalloc_(); hipMalloc(&p, n);"
    assert hipify.hipify_source(src) == (
        "hipMallocX(p); my_hipMalloc(p); hipMalloc2(p); p.hipMalloc_(); cudaMalloc(&p, n);"
    )
    # A longer HIP name with its own entry is replaced whole, not by its prefix's entry.
    assert hipify.hipify_source("hipMemcpyAsync hipMemcpy") == "cudaMemcpyAsync cudaMemcpy"
    assert hipify.hipify_source("(hipStream_t)s; hipStream_t* p;") == (
        "(cudaStream_t)s; cudaStream_t* p;"
    )
    # Digits/letters glued to a number are not identifiers.
    assert hipify.hipify_source("x = 0xffu + 1e5f;") == "x = 0xffu + 1e5f;"


# ---------------------------------------------------------------------------------------------
# Launches, shuffles, wave width
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src, expected",
    [
        (
            "hipLaunchKernelGGL(k, dim3(g), dim3(b), 0, stream, a, b);",
            "k<<<dim3(g), dim3(b), 0, stream>>>(a, b);",
        ),
        (
            "hipLaunchKernelGGL((my_kernel<T, 128>), dim3(g), dim3(b), 0, stream, a, b);",
            "my_kernel<T, 128><<<dim3(g), dim3(b), 0, stream>>>(a, b);",
        ),
        (  # nested parens and commas in the launch configuration, comparisons in arguments
            "hipLaunchKernelGGL((kern<float, (N > 2 ? 4 : 8)>), dim3((n + 3) / 4, f(x, y)), "
            "dim3(256), smem(a, b), s, x < y, g(z, w), arr[i, j]);",
            "kern<float, (N > 2 ? 4 : 8)><<<dim3((n + 3) / 4, f(x, y)), dim3(256), smem(a, b), "
            "s>>>(x < y, g(z, w), arr[i, j]);",
        ),
        (  # nested template arguments
            "hipLaunchKernelGGL(k<A, B<C, D>>, g, b, 0, s, p);",
            "k<A, B<C, D>><<<g, b, 0, s>>>(p);",
        ),
        (  # unspaced comparison at the top level of an argument
            "hipLaunchKernelGGL(k, g, b, 0, s, x<y, z);",
            "k<<<g, b, 0, s>>>(x<y, z);",
        ),
        ("hipLaunchKernelGGL(k, g, b, 0, s);", "k<<<g, b, 0, s>>>();"),
        (  # string literals with brackets and commas
            'hipLaunchKernelGGL(k, g, b, 0, s, "a,(b", \')\');',
            'k<<<g, b, 0, s>>>("a,(b", \')\');',
        ),
        (  # digit separators are not char literals
            "hipLaunchKernelGGL(k, g, b, 0, s, 1'000, ')');",
            "k<<<g, b, 0, s>>>(1'000, ')');",
        ),
        # Not launches: left alone.
        ("hipLaunchKernelGGLX(k, g, b, 0, s);", "hipLaunchKernelGGLX(k, g, b, 0, s);"),
        ("hipLaunchKernelGGL(k, g, b);", "hipLaunchKernelGGL(k, g, b);"),
        ("hipLaunchKernelGGL(k, g, b, 0, s, (a;", "hipLaunchKernelGGL(k, g, b, 0, s, (a;"),
    ],
)
def test_launch_rewrite(src: str, expected: str) -> None:
    assert hipify.hipify_source(src) == expected


def test_calls_in_comments_are_left_alone() -> None:
    # An unbalanced call quoted in a comment must not swallow the code after it.
    src = textwrap.dedent(
        """\
        // Launch with hipLaunchKernelGGL(kernel, grid, ... and mind __shfl_xor(v,
        /* hipLaunchKernelGGL(k, g, b, 0, s, x) */ const char* s = "__ballot(p)";
        hipLaunchKernelGGL(k, g, b, 0, stream, f(a, b));
        """
    )
    assert hipify.hipify_source(src) == textwrap.dedent(
        """\
        // Launch with hipLaunchKernelGGL(kernel, grid, ... and mind __shfl_xor(v,
        /* hipLaunchKernelGGL(k, g, b, 0, s, x) */ const char* s = "__ballot(p)";
        k<<<g, b, 0, stream>>>(f(a, b));
        """
    )


def test_launch_rewrite_multiline() -> None:
    src = textwrap.dedent(
        """\
        hipLaunchKernelGGL((fwd_kernel<ra_bf16, 128, 16>),
                           dim3(num_blocks, h_kv),
                           dim3(kBlockThreads),
                           0,
                           stream,
                           q,  // [total_q, h, d]
                           k,
                           static_cast<int>(n));
        """
    )
    assert hipify.hipify_source(src) == textwrap.dedent(
        """\
        fwd_kernel<ra_bf16, 128, 16><<<dim3(num_blocks, h_kv), dim3(kBlockThreads), 0, stream>>>(
                           q,  // [total_q, h, d]
                           k,
                           static_cast<int>(n));
        """
    )


@pytest.mark.parametrize(
    "src, expected",
    [
        ("__shfl_xor(v, m)", "__shfl_xor_sync(0xffffffffu, v, m)"),
        ("__shfl_xor(v, m, 16)", "__shfl_xor_sync(0xffffffffu, v, m, 16)"),
        ("__shfl(v, 0)", "__shfl_sync(0xffffffffu, v, 0)"),
        ("__shfl(v, lane, width)", "__shfl_sync(0xffffffffu, v, lane, width)"),
        ("__shfl_up(v, 1)", "__shfl_up_sync(0xffffffffu, v, 1)"),
        ("__shfl_down(v, d, RA_WAVE_SIZE)", "__shfl_down_sync(0xffffffffu, v, d, RA_WAVE_SIZE)"),
        ("__shfl_xor (f(a, b), m)", "__shfl_xor_sync(0xffffffffu, f(a, b), m)"),
        (
            "__shfl_down(__shfl_up(v, 1), 2)",
            "__shfl_down_sync(0xffffffffu, __shfl_up_sync(0xffffffffu, v, 1), 2)",
        ),
        ("__ballot(x > 0)", "__ballot_sync(0xffffffffu, x > 0)"),
        ("__any(p)", "__any_sync(0xffffffffu, p)"),
        ("__all(p && q)", "__all_sync(0xffffffffu, p && q)"),
        # Already CUDA, other names, or wrong arity: untouched.
        ("__shfl_xor_sync(0xffffffffu, v, m)", "__shfl_xor_sync(0xffffffffu, v, m)"),
        ("__ballot_sync(mask, x)", "__ballot_sync(mask, x)"),
        ("__any_sync(mask, x)", "__any_sync(mask, x)"),
        ("my__shfl_xor(v, m)", "my__shfl_xor(v, m)"),
        ("__shfl_xor(v)", "__shfl_xor(v)"),
        ("// __shfl_xor takes no mask", "// __shfl_xor takes no mask"),
    ],
)
def test_shuffles(src: str, expected: str) -> None:
    assert hipify.hipify_source(src) == expected


def test_wave_size() -> None:
    src = textwrap.dedent(
        """\
        #if defined(__AMDGCN_WAVEFRONT_SIZE) && defined __AMDGCN_WAVEFRONT_SIZE
        #define W __AMDGCN_WAVEFRONT_SIZE
        #endif
        #ifdef __AMDGCN_WAVEFRONT_SIZE
        #endif
        static_assert(__AMDGCN_WAVEFRONT_SIZE % 32 == 0, "");
        int x = __AMDGCN_WAVEFRONT_SIZEX;
        """
    )
    # defined() tests stay (the macro is undefined under nvcc; `defined(32)` would not compile).
    assert hipify.hipify_source(src) == textwrap.dedent(
        """\
        #if defined(__AMDGCN_WAVEFRONT_SIZE) && defined __AMDGCN_WAVEFRONT_SIZE
        #define W 32
        #endif
        #ifdef __AMDGCN_WAVEFRONT_SIZE
        #endif
        static_assert(32 % 32 == 0, "");
        int x = __AMDGCN_WAVEFRONT_SIZEX;
        """
    )


# ---------------------------------------------------------------------------------------------
# Idempotence and determinism of whole sources
# ---------------------------------------------------------------------------------------------

SMALL_HIP = textwrap.dedent(
    """\
    #include <hip/hip_runtime.h>

    template <typename T, int WIDTH>
    __global__ void reduce_kernel(const T* __restrict__ x, T* __restrict__ y, int n) {
      const int i = blockIdx.x * blockDim.x + threadIdx.x;
      T v = i < n ? x[i] : T(0);
    #pragma unroll
      for (int m = WIDTH / 2; m >= 1; m >>= 1) v += __shfl_xor(v, m, WIDTH);
      if (__any(v != T(0)) && (threadIdx.x % WIDTH) == 0) y[i / WIDTH] = v;
    }

    hipError_t launch_reduce(const float* x, float* y, int n, hipStream_t stream) {
      hipLaunchKernelGGL((reduce_kernel<float, 16>), dim3((n + 255) / 256), dim3(256), 0,
                         stream, x, y, n);
      return hipGetLastError();
    }
    """
)


def test_idempotent_and_deterministic() -> None:
    once = hipify.hipify_source(SMALL_HIP)
    assert hipify.hipify_source(once) == once
    assert hipify.hipify_source(SMALL_HIP) == once
    assert "hip" not in once.replace("hipify", "")
    compat = (ROOT / "hip_src/common/compat.h").read_text()
    compat_once = hipify.hipify_source(compat)
    assert hipify.hipify_source(compat_once) == compat_once


# ---------------------------------------------------------------------------------------------
# Trees and the CLI
# ---------------------------------------------------------------------------------------------


def _make_tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "a.hip").write_text('#include "b.h"\n#include "sub/c.hip"\nhipStream_t s;\n')
    (root / "b.h").write_text("#pragma once\n#include <hip/hip_runtime.h>\n")
    (root / "sub/c.hip").write_text("hipError_t e = hipSuccess;\n")
    (root / "sub/d.cpp").write_text("int main() { return 0; }\n")
    (root / "sub/e.cuh").write_text("// nothing hip here\n")
    (root / "notes.txt").write_text("not a source\n")


def test_translate_tree(tmp_path: Path) -> None:
    src, dst = tmp_path / "hip_src", tmp_path / "out"
    _make_tree(src)
    outputs = hipify.translate_tree(src, dst)
    assert [p.relative_to(dst).as_posix() for p in outputs] == [
        "a.cu", "b.h", "sub/c.cu", "sub/d.cpp", "sub/e.cuh"
    ]
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()) == [
        "a.cu", "b.h", "sub/c.cu", "sub/d.cpp", "sub/e.cuh"
    ]
    a = (dst / "a.cu").read_text()
    assert a == (
        "// Generated by tools/hipify.py from hip_src/a.hip. Do not edit.\n"
        '#include "b.h"\n#include "sub/c.cu"\ncudaStream_t s;\n'
    )
    assert (dst / "sub/c.cu").read_text().splitlines() == [
        "// Generated by tools/hipify.py from hip_src/sub/c.hip. Do not edit.",
        "cudaError_t e = cudaSuccess;",
    ]
    assert (dst / "b.h").read_text().endswith("#include <cuda_runtime.h>\n")

    # Second run: nothing changed, nothing rewritten, mtimes stay.
    old = 1_000_000_000_000_000_000
    for p in outputs:
        os.utime(p, ns=(old, old))
    snapshot = {p: p.read_bytes() for p in outputs}
    assert hipify.translate_tree(src, dst) == outputs
    assert all(p.stat().st_mtime_ns == old for p in outputs)
    assert {p: p.read_bytes() for p in outputs} == snapshot

    # Touching one source rewrites only its output.
    (src / "sub/c.hip").write_text("hipError_t e = hipGetLastError();\n")
    hipify.translate_tree(src, dst)
    assert (dst / "sub/c.cu").stat().st_mtime_ns != old
    assert [p.name for p in outputs if p.stat().st_mtime_ns != old] == ["c.cu"]

    # Translating the generated tree again is the identity, header line included.
    again = tmp_path / "again"
    hipify.translate_tree(dst, again)
    for p in outputs:
        assert (again / p.relative_to(dst)).read_bytes() == p.read_bytes()
    for p in outputs:
        os.utime(p, ns=(old, old))
    hipify.translate_tree(dst, dst)  # in place: nothing to write
    assert all(p.stat().st_mtime_ns == old for p in outputs)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "hip_src", tmp_path / "out"
    _make_tree(src)
    assert hipify._main([str(src), str(dst)]) == 0
    assert "5 written, 0 unchanged" in capsys.readouterr().out
    assert hipify._main([str(src), str(dst)]) == 0
    assert "0 written, 5 unchanged" in capsys.readouterr().out
    assert hipify._main(["--stats"]) == 0
    out = capsys.readouterr().out
    s = hipify.map_stats()
    assert f"{s['identifiers']} HIP names, {s['identifiers_multi_source']} with several" in out


def test_cli_script_runs_standalone() -> None:
    # As setup.py and CI call it: a plain script, no package, no repo on sys.path.
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools/hipify.py"), "--stats"],
        capture_output=True, text=True, cwd="/", timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "with several CUDA sources" in r.stdout


# ---------------------------------------------------------------------------------------------
# nvcc compiles the output
# ---------------------------------------------------------------------------------------------


def _nvcc(source: Path, include_dir: Path, extra: list[str] | None = None) -> None:
    cmd = [NVCC, *NVCC_FLAGS, *(extra or []), f"-I{include_dir}", "-c", str(source),
           "-o", str(source.with_suffix(".o"))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}\n--- source ---\n" + (
        source.read_text()
    )


@needs_nvcc
def test_nvcc_compiles_small_kernel(tmp_path: Path) -> None:
    src, dst = tmp_path / "hip_src", tmp_path / "cuda_src"
    src.mkdir()
    (src / "reduce.hip").write_text(SMALL_HIP)
    (out,) = hipify.translate_tree(src, dst)
    assert out.name == "reduce.cu"
    text = out.read_text()
    assert "reduce_kernel<float, 16><<<" in text and "__shfl_xor_sync(0xffffffffu," in text
    _nvcc(out, dst)


# compat.h and the headers it includes: what a probe needs beside it to compile.
COMPAT_HEADERS = ("compat.h", "device_info.h", "mma.h")


@needs_nvcc
def test_nvcc_compiles_compat_header(tmp_path: Path) -> None:
    # The real compat.h, hipified with a tiny kernel that instantiates its templates (templates
    # are only checked when instantiated), compiled with warnings as errors.
    src, dst = tmp_path / "hip_src", tmp_path / "cuda_src"
    (src / "common").mkdir(parents=True)
    for name in COMPAT_HEADERS:
        shutil.copy(ROOT / "hip_src/common" / name, src / "common" / name)
    (src / "probe.hip").write_text(
        textwrap.dedent(
            """\
            #include "common/compat.h"

            template <typename T, int WAVE>
            __global__ void probe_kernel(const ra_vec8* __restrict__ in,  // [n]
                                         ra_vec8* __restrict__ out,       // [n]
                                         float* __restrict__ s, int n) {
              const int i = blockIdx.x * blockDim.x + threadIdx.x;
              if (i >= n) return;
              float v[8];
              ra_unpack8<T>(ra_load16(in + i), v);
              float acc = ra_group_sum<8>(v[0]) + ra_group_max<4>(v[1]);
              acc += ra_strided_sum<8, WAVE>(v[2]) + ra_strided_max<8, WAVE>(v[3]);
              s[i] = acc + RA_WAVE_SIZE;
              ra_store16(out + i, ra_pack8<T>(v));
            }

            hipError_t probe(const ra_vec8* in, ra_vec8* out, float* s, int n, hipStream_t stream) {
              hipLaunchKernelGGL((probe_kernel<ra_bf16, RA_WAVE_SIZE>), dim3((n + 255) / 256),
                                 dim3(256), 0, stream, in, out, s, n);
              hipLaunchKernelGGL((probe_kernel<ra_fp16, 32>), dim3((n + 255) / 256), dim3(256), 0,
                                 stream, in, out, s, n);
              return hipGetLastError();
            }
            """
        )
    )
    outputs = hipify.translate_tree(src, dst)
    compat = (dst / "common/compat.h").read_text()
    assert "#include <cuda_runtime.h>" in compat and "__shfl_xor_sync(0xffffffffu," in compat
    _nvcc(dst / "probe.cu", dst, ["-Xcompiler", "-Wall,-Wextra,-Werror"])
    assert len(outputs) == len(COMPAT_HEADERS) + 1  # every header and the probe translated


def _asm_statements(text: str) -> list[str]:
    """Every ``asm(...)`` statement of a source, verbatim (strings, constraints, operands)."""
    out = []
    for m in re.finditer(r"\basm\s*\(", text):
        depth, i = 0, m.end() - 1
        while True:
            c = text[i]
            depth += c == "("
            depth -= c == ")"
            i += 1
            if depth == 0:
                break
        out.append(text[m.start():i])
    return out


def test_mma_header_passes_through_unchanged() -> None:
    """mma.h (matrix units) relies on hipify leaving its vendor code alone: the PTX inline asm
    (instruction strings, constraint letters, operands), the CDNA builtins and vector types, and
    the preprocessor tests that pick a vendor. Only the usual renames may touch the file."""
    text = (ROOT / "hip_src/common/mma.h").read_text()
    out = hipify.hipify_source(text)
    asm = _asm_statements(text)
    assert len(asm) >= 4  # mma bf16 / fp16, cvt bf16x2 / f16x2
    assert _asm_statements(out) == asm
    for token in ("__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", "__builtin_amdgcn_mfma_f32_16x16x16f16",
                  "ext_vector_type", "__HIP_DEVICE_COMPILE__", "__gfx90a__", "__gfx942__",
                  "__CUDA_ARCH__", "__byte_perm", "__builtin_bit_cast"):
        assert token in text and out.count(token) == text.count(token), token
    # nothing in mma.h is a HIP runtime name: the translation is the identity
    assert out == text


@needs_nvcc
def test_nvcc_compiles_mma_header(tmp_path: Path) -> None:
    # Every mma.h template instantiated the way the small-seq forward does (bf16 and fp16, each
    # operand shape), hipified and compiled for sm_90 with warnings as errors.
    src, dst = tmp_path / "hip_src", tmp_path / "cuda_src"
    (src / "common").mkdir(parents=True)
    for name in COMPAT_HEADERS:
        shutil.copy(ROOT / "hip_src/common" / name, src / "common" / name)
    (src / "probe.hip").write_text(
        textwrap.dedent(
            """\
            #include "common/compat.h"

            template <typename T, int D, int KV, int HB>
            __global__ void probe_kernel(const uint16_t* q, const uint16_t* k,  // [16, D]
                                         const uint16_t* v, uint16_t* o,        // [16, D]
                                         float* s) {                            // [16, 16]
            #if RA_HAS_MMA
              constexpr int NS = KV <= 8 ? 8 : 16;
              const int lane = threadIdx.x % RA_WAVE_SIZE;
              ra_mma_rows<D, HB> qr;
              ra_mma_rows<D, KV> kr;
              ra_mma_vrows<D, KV> vr;
              ra_mma_load_rows(qr, q, D, 16, lane);
              ra_mma_load_rows(kr, k, D, 16, lane);
              ra_mma_load_vrows(vr, v, D, 16, lane);
              ra_mma_acc<NS> acc;
              ra_mma_zero(acc);
              ra_mma_dot<T>(acc, qr, kr);
              const ra_mma_acc<NS> cs = ra_mma_col_sum(acc);
              for (int i = 0; i < ra_mma_acc<NS>::kElems; ++i)
                s[ra_mma_acc_row(lane, i) * 16 + ra_mma_acc_col(lane, i)] =
                    ra_mma_row_max(acc.x[i]) + ra_mma_row_sum(acc.x[i]) + cs.x[i];
              const ra_mma_pfrag<HB> pf = ra_mma_to_pfrag<T, HB>(acc);
              ra_mma_out<D, HB> out;
              ra_mma_zero(out);
              ra_mma_pv<T>(out, pf, vr);
              ra_mma_store_rows<T>(out, o, D, HB, lane);
            #else
              (void)q, (void)k, (void)v, (void)o, (void)s;
            #endif
            }

            template <typename T>
            void launch(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* o,
                        float* s, hipStream_t st) {
              hipLaunchKernelGGL((probe_kernel<T, 64, 4, 8>), dim3(1), dim3(32), 0, st, q, k, v, o, s);
              hipLaunchKernelGGL((probe_kernel<T, 128, 8, 16>), dim3(1), dim3(32), 0, st, q, k, v, o, s);
              hipLaunchKernelGGL((probe_kernel<T, 256, 16, 8>), dim3(1), dim3(32), 0, st, q, k, v, o, s);
            }

            hipError_t probe(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* o,
                             float* s, hipStream_t st) {
              launch<ra_bf16>(q, k, v, o, s, st);
              launch<ra_fp16>(q, k, v, o, s, st);
              return hipGetLastError();
            }
            """
        )
    )
    hipify.translate_tree(src, dst)
    _nvcc(dst / "probe.cu", dst, ["-Xcompiler", "-Wall,-Wextra,-Werror"])
    ptx = subprocess.run(
        [NVCC, *NVCC_FLAGS, "-I", str(dst), "-ptx", str(dst / "probe.cu"), "-o", "-"],
        capture_output=True, text=True, timeout=300)
    assert ptx.returncode == 0, ptx.stderr
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx.stdout
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx.stdout
