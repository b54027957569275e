// Host side of common/tma.h: tensor maps through the driver's cuTensorMapEncodeTiled, found
// once through the runtime's driver entry point (so the extension needs no -lcuda).
#include "tma.h"

#if RA_TMA_BUILD

#include <cuda_runtime.h>

namespace {

using RaEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

RaEncodeTiled ra_encode_tiled() {
  static const RaEncodeTiled encode = []() -> RaEncodeTiled {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess)
      return nullptr;
#else
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found) !=
        cudaSuccess)
      return nullptr;
#endif
    return found == cudaDriverEntryPointSuccess ? reinterpret_cast<RaEncodeTiled>(fn) : nullptr;
  }();
  return encode;
}

}  // namespace

bool ra_tma_map_16bit(CUtensorMap* map, const void* base, int64_t batch, int64_t tokens,
                      int64_t heads, int64_t d, int64_t batch_stride, int64_t token_stride,
                      int64_t head_stride, int box_heads, int box_tokens) {
  const RaEncodeTiled encode = ra_encode_tiled();
  if (encode == nullptr || base == nullptr || batch < 1 || tokens < 1 || heads < 1 || d < 64)
    return false;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  const int64_t strides_bytes[3] = {2 * head_stride, 2 * token_stride, 2 * batch_stride};
  for (const int64_t s : strides_bytes)
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40)) return false;
  if (tokens >= (int64_t{1} << 31) || batch >= (int64_t{1} << 31)) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(strides_bytes[0]),
                                 static_cast<cuuint64_t>(strides_bytes[1]),
                                 static_cast<cuuint64_t>(strides_bytes[2])};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_heads),
                             static_cast<cuuint32_t>(box_tokens), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  // The data type only sets the element size here (the copies move bits): bf16 and fp16 alike.
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims,
                strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#endif  // RA_TMA_BUILD
