// Arguments of the THD context-parallel kernels (rocm_attn.thd): one row gather/scatter kernel
// for the copy-type helpers, one merge kernel for the online-softmax merge and its corrections,
// one kernel for the gradient correction. No torch include: hip_src/bindings fills these.
//
// Conventions (see rocm_attn/thd/, whose torch paths are the oracle of every kernel here):
//  * A THD tensor is viewed as [outer, rows, heads, head_elems]: `rows` is the token dim,
//    `outer` the product of the dims before it (LSE [h, t]: outer = h), `heads` x `head_elems`
//    the dims after it, head_elems contiguous. Every stride may be arbitrary otherwise.
//  * Dual-chunk sharding over cp ranks: a padded sequence of L tokens (L % 2cp == 0) is 2cp
//    chunks of L/2cp tokens; rank r holds chunk r then chunk 2cp-1-r (its first and second
//    half). cu_seqlens are int32 [b+1] on the device and are only ever read with a binary
//    search, so nothing caps the number of sequences. Their values are never trusted: every
//    word is clamped into the rows it indexes and every row into its tensor (thd/index.h, the
//    rule for garbage cu_seqlens).
//  * Rows past cu[b] are "slack" and are carried along exactly as the torch path does.
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

// Which source row a destination row reads (thd::map_row_given); the torch function it mirrors.
enum class ThdRowMap : int32_t {
  kPartition = 0,      // dst: local row of `rank`; src: global row (_local_to_global)
  kToContiguous = 1,   // dst: global row; src: row of the all-gathered shards (_global_to_gathered)
  kToRankSharded = 2,  // dst: row of the gathered shards; src: global row
  kHalf = 3,           // dst: row k of half `half`; src: local row (_half_index)
  kCopyValid = 4,      // dst: row of the dst layout; src: row of the same valid token, or none
  kIdentity = 5,       // row k is row k (merge / grad correction without halves)
  kIndex = 6,          // merge / grad: step row k (or step_index[k]) updates row index[k]
                       // (both clamped into their tensors)
};

struct ThdRowMapParams {
  ThdRowMap kind;
  int32_t b;                // number of sequences
  const int32_t* cu;        // [b+1]: global padded (partition, reorders), local padded (half),
                            // valid-token cu_seqlens (copy valid)
  const int32_t* cu_dst;    // kCopyValid: where sequences start in dst (cu when packed)
  const int32_t* cu_src;    // kCopyValid: where sequences start in src (cu when packed)
  int32_t cp;               // partition / reorders
  int32_t rank;             // kPartition
  int32_t half;             // kHalf: 0 first, 1 second
  int64_t local_rows;       // rows of one rank's shard (partition, reorders), of the local
                            // tensor (half), of dst (copy valid: cu_dst is clamped into it), of
                            // out / grad (kIndex: index[k] is clamped into it)
  int64_t src_rows;         // kCopyValid: rows of src (cu_src and sources are clamped into it)
  const int64_t* index;     // kIndex: [n] destination row of every step row
  const int64_t* step_index;  // kIndex: [n] step row read for entry k; nullptr: row k
  int64_t step_count;       // kIndex with step_index: rows of the step tensor
};

// dst[o, r, ...] = src[o, map(r), ...] over whole rows, raw bytes (dtype-agnostic).
struct ThdCopyParams {
  const void* src;
  void* dst;
  ThdRowMapParams map;
  int64_t rows;                     // dst rows (token dim)
  int64_t outer;                    // product of the dims before the token dim (>= 1)
  int64_t src_outer_stride, dst_outer_stride;  // all strides in bytes
  int64_t src_row_stride, dst_row_stride;
  int64_t src_head_stride, dst_head_stride;
  int32_t heads;                    // contiguous segments per row
  int32_t head_bytes;               // bytes per segment
  int32_t fill;                     // rows without a source: 1 write fill_bytes, 0 keep dst
  uint32_t fill_bytes[4];           // fill value's bit pattern repeated over 16 bytes
};

enum ThdDtype : int32_t { kThdBFloat16 = 0, kThdFloat16 = 1, kThdFloat32 = 2 };

// Online-softmax merge of a partial result (out_step, lse_step) into (out, lse), in fp32:
//   merge      : new = max + log1p(exp(min - max)); out = out*exp(lse-new) + step*exp(step_lse-new)
//                (a side whose weight is 0 is dropped); lse_dst = new.
//   correction : out += out_step * exp(lse_step - lse) (lse is the final LSE); no LSE written.
// Step token k updates row k (kIdentity), row half_row(k, 1) (kHalf: second halves only) or
// row index[k] (kIndex: packed step results, or with step_index the step's row step_index[k]
// of a result laid out like out; rows repeated in index race, so callers point only rows
// they drop, e.g. a dummy row, more than once).
struct ThdMergeParams {
  const void* out;           // [t, H, D] or nullptr (LSE only)
  const float* lse;          // [H, t]
  const void* out_step;      // [n, H, D] or nullptr
  const float* lse_step;     // [H, n]
  void* out_dst;             // [t, H, D]: out itself (in place) or a new tensor; nullptr: none
  float* lse_dst;            // [H, t]: lse itself or a new tensor; nullptr: no LSE output
  int64_t out_tok, out_head;             // strides in elements
  int64_t step_tok, step_head;
  int64_t dst_tok, dst_head;
  int64_t lse_head, lse_tok;
  int64_t lse_step_head, lse_step_tok;
  int64_t lse_dst_head, lse_dst_tok;
  int64_t n;                 // step tokens
  int32_t heads;             // H
  int32_t dim;               // D (contiguous)
  int32_t out_dtype;         // ThdDtype of out and out_dst
  int32_t step_dtype;        // ThdDtype of out_step
  int32_t correction;        // 0 merge, 1 correction
  int32_t copy_first_half;   // kHalf into new tensors: also copy the first halves of out / lse
  ThdRowMapParams map;       // kIdentity or kHalf (local padded cu_seqlens)
};

enum ThdGradOp : int32_t { kThdGradNone = 0, kThdGradCopy = 1, kThdGradAdd = 2 };

// Gradient correction: for each half of every local sequence, none / copy / add grad_step into
// grad, computed in fp32 and rounded once to grad's dtype.
struct ThdGradParams {
  const void* grad;          // [t, heads, head_dim]
  const void* step;          // [t or t/2, heads, head_dim]
  void* dst;                 // grad (in place) or a new tensor
  int64_t grad_tok, grad_head;  // strides in elements
  int64_t step_tok, step_head;
  int64_t dst_tok, dst_head;
  int64_t n;                 // iterations: t (kIdentity) or t/2 (kHalf: both halves per k)
  int32_t heads, head_dim;
  int32_t grad_dtype, step_dtype;  // ThdDtype
  int32_t op0, op1;          // ThdGradOp of the first / second half (kIdentity: op0)
  int32_t step_is_half;      // step row k (one half) instead of step row = grad row
  int32_t copy_none;         // rows whose op is none: copy grad -> dst (dst is a new tensor)
  ThdRowMapParams map;       // kIdentity, kHalf, or kIndex (op0 for every entry: grad row
                             // index[k] gets step row step_index[k] / k)
};

// Launchers (thd/copy.hip, thd/merge.hip, thd/grad.hip). hipSuccess, or hipErrorInvalidValue
// when the arguments break the contract above (the bindings validate first), or the launch error.
hipError_t thd_copy_rows_launch(const ThdCopyParams& p, hipStream_t stream);
hipError_t thd_merge_launch(const ThdMergeParams& p, hipStream_t stream);
hipError_t thd_grad_launch(const ThdGradParams& p, hipStream_t stream);
