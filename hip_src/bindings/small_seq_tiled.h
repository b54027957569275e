// What the tiled small-seq ops' bindings share (small_seq_tiled.cpp: the forward;
// small_seq_tiled_bwd.cpp: the backward): the int32 bound on sizes, the offset-tensor check and
// the segment arguments' checks and params fields.
#pragma once

#include <limits>
#include <optional>

#include "bindings/torch_helpers.h"
#include "small_seq/tiled_params.h"

namespace rocm_attn::bindings {

// Rows, segments and per-segment bounds are int32 in the kernels' params.
constexpr int64_t kTiledInt32Max = std::numeric_limits<int32_t>::max();

// Batch / token / head strides (elements) of a THD ([rows, h, d]: batch 0) or BSHD
// ([b, s, h, d]) tensor, as the params' X_batch_stride / X_token_stride / X_head_stride.
inline void tiled_row_strides(const at::Tensor& t, int64_t& batch, int64_t& token,
                              int64_t& head) {
  const bool thd = t.dim() == 3;
  batch = thd ? 0 : t.stride(0);
  token = t.stride(thd ? 0 : 1);
  head = t.stride(thd ? 1 : 2);
}

// An offset tensor: contiguous 1-D int32 or int64 with `numel` entries on q's device. Returns
// whether it is int64. `op` prefixes the message, `name` is the argument.
inline bool check_tiled_offsets(const at::Tensor& t, const at::Tensor& q, int64_t numel,
                                const char* op, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
              " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.numel() == numel, op, ": ", name, " must be a 1-D tensor of ",
              numel, " entries, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  TORCH_CHECK(t.device() == q.device(), op, ": ", name, " must be on ", q.device(),
              " (the device of q), got ", t.device());
  return t.scalar_type() == at::kLong;
}

// The segments of a THD q ([total_q, h_q, d], k [total_kv, h_kv, d]; cu_seqlens_q and
// cu_seqlens_kv) or a BSHD q ([b, s_q, h_q, d], k [b, s_kv, h_kv, d]; seqlens_kv), checked and
// written to p: max_seqlen_q / max_seqlen_kv, batch, the offset pointers and their int64 flags,
// total_q, total_kv and (BSHD) s_q / s_kv. Both ops take the same segment arguments, so one
// check keeps their messages alike; `op` prefixes the messages. The offsets themselves are not
// read (no host sync). max_seqlen_q / max_seqlen_kv are range-checked by the caller, before.
inline void fill_tiled_segments(SmallSeqTiledParams& p, const at::Tensor& q, const at::Tensor& k,
                                const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_kv,
                                const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_q,
                                int64_t max_seqlen_kv, const char* op) {
  p.max_seqlen_q = static_cast<int32_t>(max_seqlen_q);
  p.max_seqlen_kv = static_cast<int32_t>(max_seqlen_kv);
  if (q.dim() == 3) {
    TORCH_CHECK(cu_seqlens_q.has_value() && cu_seqlens_kv.has_value(), op,
                ": THD q needs cu_seqlens_q and cu_seqlens_kv");
    TORCH_CHECK(!seqlens_kv.has_value(), op,
                ": seqlens_kv is for BSHD inputs; THD takes cu_seqlens_kv");
    const int64_t entries = cu_seqlens_q->numel();
    TORCH_CHECK(entries >= 1 && entries - 1 <= kTiledInt32Max - 1, op,
                ": cu_seqlens_q must have b + 1 entries (1..2^31-1), got ", entries);
    p.cu_seqlens_q_int64 = check_tiled_offsets(*cu_seqlens_q, q, entries, op, "cu_seqlens_q");
    p.cu_seqlens_kv_int64 = check_tiled_offsets(*cu_seqlens_kv, q, entries, op, "cu_seqlens_kv");
    TORCH_CHECK(q.size(0) <= kTiledInt32Max, op, ": q must have fewer than 2^31 rows");
    TORCH_CHECK(k.size(0) <= kTiledInt32Max, op, ": k must have fewer than 2^31 rows");
    p.batch = static_cast<int32_t>(entries - 1);
    p.cu_seqlens_q = cu_seqlens_q->data_ptr();
    p.cu_seqlens_kv = cu_seqlens_kv->data_ptr();
    p.total_q = static_cast<int32_t>(q.size(0));
    p.total_kv = static_cast<int32_t>(k.size(0));
  } else {
    TORCH_CHECK(seqlens_kv.has_value(), op, ": BSHD q needs seqlens_kv");
    TORCH_CHECK(!cu_seqlens_q.has_value() && !cu_seqlens_kv.has_value(), op,
                ": cu_seqlens_q / cu_seqlens_kv are for THD inputs; BSHD takes seqlens_kv");
    const int64_t b = q.size(0);
    TORCH_CHECK(k.size(0) == b, op, ": k must have the batch of q (", b, "), got ", k.size(0));
    TORCH_CHECK(max_seqlen_q == q.size(1), op, ": BSHD max_seqlen_q (", max_seqlen_q,
                ") must equal q.shape[1] (", q.size(1), ")");
    TORCH_CHECK(b <= kTiledInt32Max && b * q.size(1) <= kTiledInt32Max &&
                    k.size(1) <= kTiledInt32Max,
                op, ": q must have fewer than 2^31 rows and k fewer than 2^31 per batch");
    p.seqlens_kv_int64 = check_tiled_offsets(*seqlens_kv, q, b, op, "seqlens_kv");
    p.seqlens_kv = seqlens_kv->data_ptr();
    p.batch = static_cast<int32_t>(b);
    p.s_q = static_cast<int32_t>(q.size(1));
    p.total_q = static_cast<int32_t>(b * q.size(1));
    p.total_kv = p.s_kv = static_cast<int32_t>(k.size(1));
  }
}

}  // namespace rocm_attn::bindings
