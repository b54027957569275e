// What the simplest possible kernel reaches at the THD helpers' launch sizes: the ceiling that
// their % of floor (bench_thd) is judged against where a launch is too small to reach the
// copy bandwidth. NVIDIA only (overlapped launch through griddepcontrol); no torch.
//
// Two patterns, contiguous 16-byte vectors, VPT vectors per thread loaded before any store:
//   copy  dst[i] = src[i]          (partition, read_half, copy_valid_tokens: read R, write R)
//   add   g[i] += s[i], bf16       (grad_correction_, merge_second_half_: read 2R, write R,
//                                   in place)
// timed like rocm_attn/bench/common.py: >= 20 calls captured in one CUDA graph over input sets
// rotating through >= 512 MiB (the destination rotating too, or one fixed destination, as an
// out-of-place helper's output recycled by the caching allocator), median over replays.
// Floor = bytes / the bandwidth of a 2 GiB device-to-device copy measured in the same run.
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o launch_ceiling launch_ceiling.cu
// Run:   ./launch_ceiling [json path]   (prints a table; one JSON object per line to the path)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,               \
                   cudaGetErrorString(e_));                                        \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

constexpr int kThreads = 256;

__device__ __forceinline__ void overlap_prologue(bool pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
}

template <int VPT>
__global__ void __launch_bounds__(kThreads) copy_kernel(const int4* __restrict__ src,
                                                        int4* __restrict__ dst, long n, bool pdl) {
  overlap_prologue(pdl);
  const long base = static_cast<long>(blockIdx.x) * kThreads * VPT + threadIdx.x;
  int4 v[VPT];
#pragma unroll
  for (int u = 0; u < VPT; ++u)
    if (base + u * kThreads < n) v[u] = src[base + u * kThreads];
#pragma unroll
  for (int u = 0; u < VPT; ++u)
    if (base + u * kThreads < n) dst[base + u * kThreads] = v[u];
}

__device__ __forceinline__ int4 add_bf16x8(int4 a, int4 b) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
  int4 r;
  __nv_bfloat162* z = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fx = __bfloat1622float2(x[i]), fy = __bfloat1622float2(y[i]);
    z[i] = __floats2bfloat162_rn(fx.x + fy.x, fx.y + fy.y);
  }
  return r;
}

template <int VPT>
__global__ void __launch_bounds__(kThreads) add_kernel(int4* __restrict__ g,
                                                       const int4* __restrict__ s, long n,
                                                       bool pdl) {
  overlap_prologue(pdl);
  const long base = static_cast<long>(blockIdx.x) * kThreads * VPT + threadIdx.x;
  int4 a[VPT], b[VPT];
#pragma unroll
  for (int u = 0; u < VPT; ++u) {
    if (base + u * kThreads < n) {
      a[u] = g[base + u * kThreads];
      b[u] = s[base + u * kThreads];
    }
  }
#pragma unroll
  for (int u = 0; u < VPT; ++u)
    if (base + u * kThreads < n) g[base + u * kThreads] = add_bf16x8(a[u], b[u]);
}

template <class K, class... A>
void launch(K kernel, long n, int vpt, bool pdl, cudaStream_t st, A... args) {
  const long per_block = static_cast<long>(kThreads) * vpt;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((n + per_block - 1) / per_block));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, args..., n, pdl));
}

void launch_case(bool add, int vpt, bool pdl, int4* a, int4* b, long n, cudaStream_t st) {
  // copy: a = src, b = dst; add: a = g (in place), b = s
  switch (vpt) {
#define CASE(V)                                                                          \
  case V:                                                                                \
    if (add)                                                                             \
      launch(add_kernel<V>, n, V, pdl, st, a, static_cast<const int4*>(b));              \
    else                                                                                 \
      launch(copy_kernel<V>, n, V, pdl, st, static_cast<const int4*>(a), b);             \
    break;
    CASE(1)
    CASE(2)
    CASE(4)
    CASE(8)
#undef CASE
    default:
      std::exit(2);
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median ms of `reps` calls of enqueue() on st, each timed alone between two events, after
// `warmup` untimed ones.
template <class Enqueue>
float median_ms(cudaStream_t st, int warmup, int reps, Enqueue enqueue) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < warmup + reps; ++i) {
    CHECK(cudaEventRecord(e0, st));
    enqueue();
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float t;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= warmup) ms.push_back(t);
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return median(ms);
}

// 2 GiB device-to-device copy, one call at a time (as bench/common.py copy_bandwidth): bytes/s.
double copy_bandwidth(cudaStream_t st) {
  const size_t n = size_t{2} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, n));
  CHECK(cudaMalloc(&dst, n));
  CHECK(cudaMemsetAsync(src, 1, n, st));
  const float ms = median_ms(st, 5, 20, [&] {
    CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st));
  });
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  return 2.0 * n / (ms * 1e-3);
}

struct Case {
  std::string name;  // the bench_thd rows it bounds
  bool add;
  long bytes_r;  // bytes of one operand (the destination's)
};

int main(int argc, char** argv) {
  FILE* json = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double bw = copy_bandwidth(st);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, copy bandwidth %.0f GB/s (2 GiB cudaMemcpy)\n", prop.name, bw / 1e9);
  // bench_thd, b16 x s4096 x h16 x d64 bf16: local tokens t = 65536 / cp, rows of 2 KB
  const long row = 2048;
  std::vector<Case> cases;
  for (int cp : {2, 4, 8}) {
    const long t = 65536 / cp;
    cases.push_back({"partition/copy_valid cp" + std::to_string(cp), false, t * row});
    cases.push_back({"read_half cp" + std::to_string(cp), false, t / 2 * row});
    cases.push_back({"grad/merge_half cp" + std::to_string(cp), true, t / 2 * row});
  }
  std::printf("%-28s %-5s %-9s %9s %9s %7s %4s %4s\n", "rows bounded", "op", "dst", "MB", "us",
              "%floor", "vpt", "pdl");
  const long rotation = 512l << 20;
  for (const Case& c : cases) {
    for (bool fixed_dst : {false, true}) {
      if (c.add && fixed_dst) continue;  // in place: the destination is an input
      const long n = c.bytes_r / 16;
      const long set_bytes = (fixed_dst ? 1 : 2) * c.bytes_r;
      const int sets =
          static_cast<int>(std::min<long>(64, std::max<long>(2, (rotation + set_bytes - 1) /
                                                                     set_bytes)));
      std::vector<int4*> a(sets), b(sets);
      for (int i = 0; i < sets; ++i) {
        CHECK(cudaMalloc(&a[i], c.bytes_r));
        CHECK(cudaMemsetAsync(a[i], 0x3c, c.bytes_r, st));
        if (!fixed_dst || i == 0) {
          CHECK(cudaMalloc(&b[i], c.bytes_r));
          CHECK(cudaMemsetAsync(b[i], 0x3c, c.bytes_r, st));
        } else {
          b[i] = b[0];
        }
      }
      const int calls = std::max(20, sets);
      const double moved = (c.add ? 3.0 : 2.0) * c.bytes_r;
      const double floor_us = moved / bw * 1e6;
      float best = 1e30f;
      int best_vpt = 0;
      bool best_pdl = false;
      for (bool pdl : {false, true}) {
        for (int vpt : {1, 2, 4, 8}) {
          auto run = [&]() {
            for (int i = 0; i < calls; ++i)
              launch_case(c.add, vpt, pdl, a[i % sets], b[i % sets], n, st);
          };
          for (int w = 0; w < 2; ++w) run();
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          run();
          CHECK(cudaStreamEndCapture(st, &graph));
          CHECK(cudaGraphInstantiate(&exec, graph, 0));
          const float us =
              median_ms(st, 3, 10, [&] { CHECK(cudaGraphLaunch(exec, st)); }) * 1e3f / calls;
          if (json)
            std::fprintf(json,
                         "{\"rows\": \"%s\", \"op\": \"%s\", \"dst\": \"%s\", \"bytes\": %.0f, "
                         "\"us\": %.3f, \"pct_floor\": %.1f, \"vpt\": %d, \"pdl\": %d, "
                         "\"copy_bw\": %.0f}\n",
                         c.name.c_str(), c.add ? "add" : "copy",
                         fixed_dst ? "fixed" : "rotating", moved, us, 100 * floor_us / us, vpt,
                         pdl ? 1 : 0, bw);
          if (us < best) {
            best = us;
            best_vpt = vpt;
            best_pdl = pdl;
          }
          CHECK(cudaGraphExecDestroy(exec));
          CHECK(cudaGraphDestroy(graph));
        }
      }
      std::printf("%-28s %-5s %-9s %9.1f %9.2f %6.1f%% %4d %4d\n", c.name.c_str(),
                  c.add ? "add" : "copy", fixed_dst ? "fixed" : "rotating", moved / 1e6, best,
                  100 * floor_us / best, best_vpt, best_pdl ? 1 : 0);
      for (int i = 0; i < sets; ++i) {
        CHECK(cudaFree(a[i]));
        if (!fixed_dst || i == 0) CHECK(cudaFree(b[i]));
      }
    }
  }
  if (json) std::fclose(json);
  return 0;
}
