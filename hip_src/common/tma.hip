// Host side of common/tma.h: tensor maps through the driver's cuTensorMapEncodeTiled, found
// once in libcuda (the extension links none).
#include "tma.h"

#if RA_TMA_BUILD

#include <dlfcn.h>

namespace {

using RaEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled (driver 12.0+), straight from libcuda: the runtime's
// entry-point queries differ between CUDA releases (cudaGetDriverEntryPointByVersion exists
// only from 12.5, and the runtime torch loads may be older than the headers of the build), and
// the extension links no libcuda. nullptr where there is no driver: the callers keep their
// cp.async kernels.
RaEncodeTiled ra_encode_tiled() {
  static const RaEncodeTiled encode = []() -> RaEncodeTiled {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    return reinterpret_cast<RaEncodeTiled>(dlsym(lib, "cuTensorMapEncodeTiled"));
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
  // A dimension of one entry is never stepped over: its stride only has to be legal, so it
  // gets the extent of the dimensions inside it (the tensor's own stride may be anything).
  const int64_t head_bytes = heads == 1 ? 2 * d : 2 * head_stride;
  const int64_t token_bytes = tokens == 1 ? heads * head_bytes : 2 * token_stride;
  const int64_t batch_bytes = batch == 1 ? tokens * token_bytes : 2 * batch_stride;
  const int64_t strides_bytes[3] = {head_bytes, token_bytes, batch_bytes};
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
