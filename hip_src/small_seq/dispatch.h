// Compile-time variants of the small-seq kernels and the run-time switch over them.
// The variant lists here and in tools/generate_kernels.py must agree (a test checks).
#pragma once

#include "../common/compat.h"
#include "params.h"
#include "plan.h"

namespace small_seq {

// One plan record of the variant (launch_impl.h).
template <typename T, int D, int KV>
hipError_t run_fwd(const SmallSeqParams& p, const SmallSeqLaunch& launch, hipStream_t stream);
template <typename T, int D, int KV>
hipError_t run_fwd_row_max(const SmallSeqParams& p, const SmallSeqLaunch& launch,
                           hipStream_t stream, float* row_max);
template <typename T, int D, int KV>
hipError_t run_bwd(const SmallSeqParams& p, const SmallSeqLaunch& launch, hipStream_t stream);

// The kv bucket of a plan record (4, 8 or 16; a value between maps to the next bucket). Rows
// past a segment's length are never loaded, so a bucket only sets how many registers a wave
// reserves; three buckets keep the build small.
#define SMALL_SEQ_KV_SWITCH(max_kv, KV, ...)        \
  [&] {                                             \
    if ((max_kv) <= 4) {                            \
      constexpr int KV = 4;                         \
      return __VA_ARGS__();                         \
    } else if ((max_kv) <= 8) {                     \
      constexpr int KV = 8;                         \
      return __VA_ARGS__();                         \
    } else {                                        \
      constexpr int KV = 16;                        \
      return __VA_ARGS__();                         \
    }                                               \
  }()

#define SMALL_SEQ_HEAD_DIM_SWITCH(head_dim, D, ...)                   \
  [&] {                                                               \
    switch (head_dim) {                                               \
      case 64: { constexpr int D = 64; return __VA_ARGS__(); }        \
      case 128: { constexpr int D = 128; return __VA_ARGS__(); }      \
      case 256: { constexpr int D = 256; return __VA_ARGS__(); }      \
      case 512: { constexpr int D = 512; return __VA_ARGS__(); }      \
      default: return hipErrorInvalidValue; /* callers validate first */ \
    }                                                                 \
  }()

#define SMALL_SEQ_DTYPE_SWITCH(dtype, T, ...)                                        \
  [&] {                                                                              \
    if ((dtype) == SmallSeqDtype::kBFloat16) {                                       \
      using T = ra_bf16;                                                             \
      return __VA_ARGS__();                                                          \
    } else {                                                                         \
      using T = ra_fp16;                                                             \
      return __VA_ARGS__();                                                          \
    }                                                                                \
  }()

}  // namespace small_seq
