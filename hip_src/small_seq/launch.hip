// Run-time dispatch of the one-query small-seq kernels onto their compiled variants: the plan's
// one record names the kernel, its head dim and its kv bucket (plan.h); launch_impl.h checks
// the rest of the record against the variant and the call.
#include "dispatch.h"

namespace {

// The plan's record where it is one launch for this head dim over a compiled kv bucket that
// holds the call's history (a larger bucket than the smallest is valid: rows past a segment's
// length are never loaded); nullptr otherwise.
const SmallSeqLaunch* one_query_record(const SmallSeqParams& p, const SmallSeqPlan& plan,
                                       int head_dim) {
  if (!small_seq_supports(head_dim) || p.num_heads_kv <= 0 || p.max_seqlen_kv < 1 ||
      p.max_seqlen_kv > 16 || plan.launches != 1 || plan.fallbacks != 0)
    return nullptr;
  const SmallSeqLaunch& l = plan.launch[0];
  const int kv = l.p[1];
  if (l.p[0] != head_dim || (kv != 4 && kv != 8 && kv != 16) || kv < p.max_seqlen_kv)
    return nullptr;
  return &l;
}

}  // namespace

hipError_t small_seq_fwd_launch(const SmallSeqParams& p, const SmallSeqPlan& plan,
                                SmallSeqDtype dtype, int head_dim, hipStream_t stream,
                                float* row_max) {
  const SmallSeqLaunch* l = one_query_record(p, plan, head_dim);
  if (l == nullptr) return hipErrorInvalidValue;
  return SMALL_SEQ_DTYPE_SWITCH(dtype, T, [&] {
    return SMALL_SEQ_HEAD_DIM_SWITCH(head_dim, D, [&] {
      return SMALL_SEQ_KV_SWITCH(l->p[1], KV, [&] {
        return row_max != nullptr
                   ? small_seq::run_fwd_row_max<T, D, KV>(p, *l, stream, row_max)
                   : small_seq::run_fwd<T, D, KV>(p, *l, stream);
      });
    });
  });
}

hipError_t small_seq_bwd_launch(const SmallSeqParams& p, const SmallSeqPlan& plan,
                                SmallSeqDtype dtype, int head_dim, hipStream_t stream) {
  const SmallSeqLaunch* l = one_query_record(p, plan, head_dim);
  if (l == nullptr) return hipErrorInvalidValue;
  return SMALL_SEQ_DTYPE_SWITCH(dtype, T, [&] {
    return SMALL_SEQ_HEAD_DIM_SWITCH(head_dim, D, [&] {
      return SMALL_SEQ_KV_SWITCH(l->p[1], KV,
                                 [&] { return small_seq::run_bwd<T, D, KV>(p, *l, stream); });
    });
  });
}
