// Arguments of the tiled small-seq kernels (any number of queries per segment, key tiles with
// online softmax), forward and backward. Plain host/device data: the bindings fill it.
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

#include "plan.h"

// Where segment i finds its rows (tiled_segment.h reads and checks them):
//  q side  THD : rows cu_seqlens_q[i] .. cu_seqlens_q[i+1]-1 of q ([total_q, h_q, d]).
//          BSHD: cu_seqlens_q == nullptr; rows j < s_q of batch i of q ([b, s_q, h_q, d]).
//  kv side THD : rows cu_seqlens_kv[i] .. cu_seqlens_kv[i+1]-1 of k/v ([total_kv, h_kv, d]).
//          BSHD: cu_seqlens_kv == nullptr; rows j < seqlens_kv[i] of batch i ([b, s_kv, h_kv, d]).
// A row (batch bi, token t) of tensor X lives at bi * X_batch_stride + t * X_token_stride (+ head
// * X_head_stride): THD rows have batch 0, so their batch strides are never used.
// Query rows are numbered for lse / probs / dlse as THD cu_seqlens_q[i] + j, BSHD i * s_q + j.
// All strides are in elements; the head-dim stride is 1 and rows are 16-byte aligned.
struct SmallSeqTiledParams {
  // Tensors. q/o/dout/out/dq: q's shape; k/v/dk/dv: k's shape.
  const void* q;
  const void* k;
  const void* v;
  void* o;           // forward output
  float* lse;        // [h_q, total_q] natural-log LSE (forward writes, backward reads)
  // forward, or nullptr (nothing written): [h_q, total_q] (lse_head_stride, the LSE's rows)
  // each row's maximum scaled logit scale * max_j q.k_j in natural units; -inf for rows
  // without keys and padding rows, NaN for a bad segment's rows, as the LSE
  float* row_max;
  float* probs;      // [total_q, h_q, max_seqlen_kv] (forward, return_softmax) or nullptr
  const void* dout;  // backward: gradient of o
  const void* out;   // backward: the forward output (rowsum(dO * O))
  const float* dlse; // backward: gradient of the LSE [h_q, total_q], or nullptr
  void* dq;
  void* dk;
  void* dv;

  // Offsets: int32 or int64 each, as the flags say (never converted on the host).
  const void* cu_seqlens_q;   // [b+1] (THD q) or nullptr (BSHD q)
  const void* cu_seqlens_kv;  // [b+1] (THD kv) or nullptr (BSHD kv)
  const void* seqlens_kv;     // [b] (BSHD kv) or nullptr
  bool cu_seqlens_q_int64;
  bool cu_seqlens_kv_int64;
  bool seqlens_kv_int64;

  int32_t* error_state;  // [2]: count of bad segments, INT32_MAX - lowest bad segment

  int64_t q_batch_stride, q_token_stride, q_head_stride;
  int64_t k_batch_stride, k_token_stride, k_head_stride;
  int64_t v_batch_stride, v_token_stride, v_head_stride;
  int64_t o_batch_stride, o_token_stride, o_head_stride;
  int64_t out_batch_stride, out_token_stride, out_head_stride;  // backward
  int64_t do_batch_stride, do_token_stride, do_head_stride;     // backward
  int64_t dq_batch_stride, dq_token_stride, dq_head_stride;     // backward
  int64_t dk_batch_stride, dk_token_stride, dk_head_stride;     // backward
  int64_t dv_batch_stride, dv_token_stride, dv_head_stride;     // backward
  int64_t lse_head_stride;   // lse (and probs' row count): total_q query rows
  int64_t dlse_head_stride;  // backward

  int32_t batch;          // segments b
  int32_t total_q;        // query rows (THD q rows; BSHD b * s_q)
  int32_t total_kv;       // THD k/v rows; BSHD s_kv
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t max_seqlen_q;   // host contract (BSHD: == s_q)
  int32_t max_seqlen_kv;  // host contract, <= the kernels' limit (tiled_limits)
  int32_t s_q;            // BSHD q rows per batch; 0 for THD q
  int32_t s_kv;           // BSHD kv rows per batch; 0 for THD kv
  float softmax_scale;

  // Backward scratch (fp32), allocated by the binding; nullptr / 0 when unused.
  float* workspace;
  int64_t workspace_elems;
  // The work queue: a counter the binding zeroes per call where the plan's record asks for one
  // (the warp-specialized forward's QUEUE); its blocks take their items by atomicAdd on it in
  // place of a grid stride. nullptr otherwise.
  unsigned long long* work_queue;
};

// Largest max_seqlen_kv the tiled kernels serve (rocm_attn/small_seq.py KERNEL_MAX_SEQLEN_KV
// mirrors it). Keys are streamed in tiles, so nothing in a kernel is sized by it; it bounds
// how long one work item runs (one wave walks all key tiles of its segment), and beyond it the
// package's varlen attention, which splits long key ranges over many blocks, is the better
// kernel. See docs/kernels.md#tiled-small-seq-kernels.
constexpr int kSmallSeqTiledMaxSeqlenKv = 4096;

// Head dims the tiled kernels serve.
inline bool small_seq_tiled_supports(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

enum class SmallSeqTiledDtype : int { kFloat16 = 0, kBFloat16 = 1 };

// Launchers (tiled_launch.hip). Return hipSuccess or the launch error; hipErrorInvalidValue
// for an unsupported head dim (the bindings check first) or a plan the call or device cannot
// take; hipErrorNotSupported for a plan whose kernel this build lacks (each runs the kernels
// its plan names: plan.h).
hipError_t small_seq_tiled_fwd_launch(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                                      SmallSeqTiledDtype dtype, int head_dim,
                                      hipStream_t stream);
hipError_t small_seq_tiled_bwd_launch(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                                      SmallSeqTiledDtype dtype, int head_dim,
                                      hipStream_t stream);
