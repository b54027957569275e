// Probe for a TMA-staged warpgroup forward: does one tensor-map tile copy (cp.async.bulk.tensor,
// 128-byte swizzle, completion on an mbarrier) land
//   1. a K / V box of 64 keys x 64 head-dim columns of one kv head ([tokens, heads, d] tensor),
//   2. a GQA-folded Q box (64 / group tokens x the group's q heads x 64 columns), rows in the
//      order r = token * group + head that the tiled kernels use,
// in the shared layout of hip_src/common/wgmma.h (ra_wgmma_offset: 128-byte rows, 16-byte chunk
// x of row r at chunk x ^ (r % 8)), and are rows past the tensor's end zeros? Rows past a
// segment but inside the tensor are the next segment's: a kernel must mask or zero them itself.
// NVIDIA sm_90 only; no torch. Prints one line per check and exits 1 on a mismatch.
//
// Build: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//          -o tma_layout_probe tools/diag/tma_layout_probe.cu
// (cuTensorMapEncodeTiled comes through the runtime's driver entry point: no -lcuda)
// Run:   ./tma_layout_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

constexpr int kBoxCols = 64;  // 128 bytes of 16-bit elements: one swizzle row
constexpr int kBoxRows = 64;
constexpr uint32_t kBoxBytes = kBoxCols * kBoxRows * 2;

// The layout of common/wgmma.h for one 64-column panel (ra_wgmma_offset with col < 64).
uint32_t panel_offset(uint32_t row, uint32_t col) {
  return row * 128 + ((((col % 64) / 8) ^ (row % 8)) << 4) + (col % 8) * 2;
}

// One tile copy of box (c0 = first column, c1 = first head, c2 = first token) into 1024-byte
// aligned shared memory, then the raw bytes out.
__global__ void copy_box(const __grid_constant__ CUtensorMap map, int c0, int c1, int c2,
                         uint8_t* out) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) uint64_t bar;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - raw % 1024) % 1024;
  const uint32_t dst = raw + pad;
  const uint32_t mbar = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mbar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbar),
                 "r"(kBoxBytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(mbar)
        : "memory");
  }
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(mbar)
      : "memory");
  for (uint32_t i = threadIdx.x; i < kBoxBytes; i += blockDim.x) out[i] = smem_raw[pad + i];
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// A [tokens, heads, 128] 16-bit tensor whose element (t, h, c) holds a value naming it.
struct Tensor {
  int tokens, heads;
  std::vector<uint16_t> host;
  void* dev = nullptr;
  static uint16_t value(int t, int h, int c) {
    return static_cast<uint16_t>(((t * 7 + h * 3) * 128 + c) % 65521 + 1);
  }
  Tensor(int t, int h) : tokens(t), heads(h), host(static_cast<size_t>(t) * h * 128) {
    for (int i = 0; i < t; ++i)
      for (int j = 0; j < h; ++j)
        for (int c = 0; c < 128; ++c) host[(static_cast<size_t>(i) * h + j) * 128 + c] = value(i, j, c);
    CHECK(cudaMalloc(&dev, host.size() * 2));
    CHECK(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  }
};

// Tensor map of `x` with boxes of 64 columns x box_heads heads x box_tokens tokens.
CUtensorMap make_map(EncodeTiled encode, const Tensor& x, int box_heads, int box_tokens) {
  CUtensorMap map;
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(x.heads),
                              static_cast<cuuint64_t>(x.tokens)};
  const cuuint64_t strides[2] = {128 * 2, static_cast<cuuint64_t>(x.heads) * 128 * 2};
  const cuuint32_t box[3] = {kBoxCols, static_cast<cuuint32_t>(box_heads),
                             static_cast<cuuint32_t>(box_tokens)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, x.dev, dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    std::exit(2);
  }
  return map;
}

// Copies the box at (col0, head0, token0) and checks every element: box row r is token
// token0 + r / group, head head0 + r % group (group = the box's heads); zeros past the tensor.
bool check_box(const char* name, const CUtensorMap& map, const Tensor& x, int group, int col0,
               int head0, int token0) {
  uint8_t* out = nullptr;
  CHECK(cudaMalloc(&out, kBoxBytes));
  CHECK(cudaMemset(out, 0xff, kBoxBytes));
  copy_box<<<1, 128, kBoxBytes + 1024>>>(map, col0, head0, token0, out);
  CHECK(cudaGetLastError());
  std::vector<uint16_t> got(kBoxBytes / 2);
  CHECK(cudaMemcpy(got.data(), out, kBoxBytes, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(out));
  int bad = 0;
  for (int r = 0; r < kBoxRows; ++r)
    for (int c = 0; c < kBoxCols; ++c) {
      const int t = token0 + r / group, h = head0 + r % group;
      const uint16_t want = t < x.tokens ? Tensor::value(t, h, col0 + c) : 0;
      const uint16_t have = got[panel_offset(r, c) / 2];
      if (have != want && bad++ < 5)
        std::printf("  %s: row %d col %d: %u, want %u\n", name, r, c, have, want);
    }
  std::printf("%s %s\n", bad ? "FAIL" : "PASS", name);
  return bad == 0;
}

int main() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFuncSetAttribute(copy_box, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kBoxBytes + 1024));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    return 2;
  }
  const EncodeTiled encode = reinterpret_cast<EncodeTiled>(fn);
  bool ok = true;
  // K / V: 100 tokens, 3 kv heads; boxes of 64 keys x 1 head.
  const Tensor kv(100, 3);
  const CUtensorMap kv_map = make_map(encode, kv, 1, kBoxRows);
  ok &= check_box("kv box, first panel, inside the tensor", kv_map, kv, 1, 0, 1, 0);
  ok &= check_box("kv box, second panel, past the tensor's end", kv_map, kv, 1, 64, 2, 40);
  // A tensor shorter than the box (30 tokens against 64 rows): the rows past it read as zeros.
  const Tensor short_kv(30, 2);
  const CUtensorMap short_map = make_map(encode, short_kv, 1, kBoxRows);
  ok &= check_box("kv box, tensor shorter than the box", short_map, short_kv, 1, 0, 1, 0);
  // Q: 50 tokens, 8 q heads; a GQA group of 4 (kv head 1: q heads 4..7), 16 tokens a box.
  const Tensor q(50, 8);
  const CUtensorMap q_map = make_map(encode, q, 4, kBoxRows / 4);
  ok &= check_box("q box, group 4, rows token-major", q_map, q, 4, 0, 4, 10);
  ok &= check_box("q box, group 4, past the tensor's end", q_map, q, 4, 64, 4, 40);
  CHECK(cudaDeviceSynchronize());
  std::printf("%s\n", ok ? "all checks passed" : "some checks FAILED");
  return ok ? 0 : 1;
}
