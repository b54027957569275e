// Arguments of the small-sequence attention kernels (one query token per segment, <= 16 keys).
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

#include "plan.h"

// Where segment i finds its query row and its key/value rows.
//  THD : q row cu_seqlens_q[i] (cu_seqlens_q[i+1]-cu_seqlens_q[i] must be 1);
//        kv rows cu_seqlens_kv[i] .. cu_seqlens_kv[i+1]-1.
//  BSHD: q row i; kv rows i*kv_batch_stride + j*kv_token_stride for j < seqlens_kv[i]; rows
//        seqlens_kv[i] .. kv_rows_per_batch-1 are padding (gradients written as zeros).
// All strides are in elements; the last (head-dim) stride is 1.
struct SmallSeqParams {
  // Tensors. q/o/dq/do: [b or total_q, h_q, d]; k/v/dk/dv: [total_kv, h_kv, d] or [b, s, h_kv, d].
  const void* q;
  const void* k;
  const void* v;
  void* o;        // forward output
  float* lse;     // [h_q, b] natural-log LSE
  float* probs;   // [b, h_q, max_seqlen_kv] or nullptr
  const void* dout;  // backward only
  const void* out;   // backward only (forward output, for rowsum(dO * O))
  const float* dlse;  // backward only: gradient of the LSE output [h_q, b], or nullptr
  void* dq;
  void* dk;
  void* dv;

  const int32_t* cu_seqlens_q;   // [b+1] (THD) or nullptr (BSHD)
  const int32_t* cu_seqlens_kv;  // [b+1] (THD) or nullptr (BSHD)
  const int32_t* seqlens_kv;     // [b] (BSHD) or nullptr (THD)
  int32_t* error_state;          // [2]: count of bad segments, INT32_MAX - first bad segment

  int64_t q_token_stride, q_head_stride;
  int64_t k_token_stride, k_head_stride, k_batch_stride;
  int64_t v_token_stride, v_head_stride, v_batch_stride;
  int64_t o_token_stride, o_head_stride;      // also dO (dout uses its own strides below)
  int64_t do_token_stride, do_head_stride;
  int64_t dq_token_stride, dq_head_stride;    // dq/dk/dv are allocated contiguous
  int64_t dkv_token_stride, dkv_head_stride, dkv_batch_stride;

  int32_t batch;            // segments
  int32_t total_q;          // rows of q (bounds for THD q indices)
  int32_t total_kv;         // rows of k/v in THD (bounds), s in BSHD
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t max_seqlen_kv;    // host contract, <= the kernel's KV bucket
  int32_t kv_rows_per_batch;  // BSHD s (padding rows to zero in dk/dv); 0 for THD
  float softmax_scale;
};

enum class SmallSeqDtype : int { kFloat16 = 0, kBFloat16 = 1 };

// Launchers (launch.hip): run the plan's one launch (plan.h; rocm_attn/small_seq_plan.py
// one_query_plans). Return hipSuccess, the launch error, hipErrorNotSupported where the record
// names no one-query kernel of the direction, or hipErrorInvalidValue where the plan does not
// fit the call (not one launch, another head dim, a kv bucket that does not hold
// max_seqlen_kv, a kernel of another GQA group, PIPE where the variant has no pipelined loop).
// row_max: nullptr, or [h_q, b] that the forward fills with each row's maximum scaled logit
// scale * max_j q.k_j (natural units; -inf without keys, NaN for a bad segment, as the LSE),
// by kernels of their own (launch_impl.h run_fwd_row_max).
hipError_t small_seq_fwd_launch(const SmallSeqParams& p, const SmallSeqPlan& plan,
                                SmallSeqDtype dtype, int head_dim, hipStream_t stream,
                                float* row_max = nullptr);
hipError_t small_seq_bwd_launch(const SmallSeqParams& p, const SmallSeqPlan& plan,
                                SmallSeqDtype dtype, int head_dim, hipStream_t stream);

// Supported head dims and kv buckets; the launcher rejects others loudly.
// Inline: the bindings and the launchers share it without a call across translation units.
inline bool small_seq_supports(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512;
}
