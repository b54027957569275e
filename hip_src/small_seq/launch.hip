// Run-time dispatch of the small-seq kernels onto their compiled variants.
#include "dispatch.h"

hipError_t small_seq_fwd_launch(const SmallSeqParams& p, SmallSeqDtype dtype, int head_dim,
                                hipStream_t stream) {
  if (!small_seq_supports(head_dim) || p.max_seqlen_kv > 16) return hipErrorInvalidValue;
  return SMALL_SEQ_DTYPE_SWITCH(dtype, T, [&] {
    return SMALL_SEQ_HEAD_DIM_SWITCH(head_dim, D, [&] {
      return SMALL_SEQ_KV_SWITCH(p.max_seqlen_kv, KV,
                                 [&] { return small_seq::run_fwd<T, D, KV>(p, stream); });
    });
  });
}

hipError_t small_seq_bwd_launch(const SmallSeqParams& p, SmallSeqDtype dtype, int head_dim,
                                hipStream_t stream) {
  if (!small_seq_supports(head_dim) || p.max_seqlen_kv > 16) return hipErrorInvalidValue;
  return SMALL_SEQ_DTYPE_SWITCH(dtype, T, [&] {
    return SMALL_SEQ_HEAD_DIM_SWITCH(head_dim, D, [&] {
      return SMALL_SEQ_KV_SWITCH(p.max_seqlen_kv, KV,
                                 [&] { return small_seq::run_bwd<T, D, KV>(p, stream); });
    });
  });
}
