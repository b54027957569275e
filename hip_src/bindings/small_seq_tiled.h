// What the tiled small-seq ops' bindings share (small_seq_tiled.cpp: the forward;
// small_seq_tiled_bwd.cpp: the backward): the offset-tensor check and the int32 bound on sizes.
#pragma once

#include <limits>

#include "bindings/torch_helpers.h"

namespace rocm_attn::bindings {

// Rows, segments and per-segment bounds are int32 in the kernels' params.
constexpr int64_t kTiledInt32Max = std::numeric_limits<int32_t>::max();

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

}  // namespace rocm_attn::bindings
