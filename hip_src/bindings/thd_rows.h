// What the THD bindings files (thd_copy.cpp, thd_merge.cpp, thd_grad.cpp) share: a tensor's
// dims as the kernels' [outer, rows, heads, head_elems] view, the cu_seqlens and row-index
// checks, the row maps and the math dtype. rocm_attn/thd validates every argument before it
// calls an op; these checks are the last line of defence for direct torch.ops callers.
#pragma once

#include <vector>

#include "bindings/torch_helpers.h"
#include "thd/params.h"

namespace rocm_attn::bindings {

// Dims [begin, end) of t merged into one dim (size, stride in elements); false when they do
// not merge. Size-1 dims are skipped; an empty range gives (1, 1).
bool thd_collapse(const at::Tensor& t, int64_t begin, int64_t end, int64_t& size, int64_t& stride);

// Dims [begin, ndim) of tensors with one trailing shape as [heads, head_elems]: head_elems the
// trailing dims contiguous in every tensor, heads the dims before them merged (one stride per
// tensor). Mirrored by _row_split in rocm_attn/thd/_kernels.py.
bool thd_split_rows(const std::vector<const at::Tensor*>& ts, int64_t begin, int64_t& heads,
                    int64_t& head_elems, std::vector<int64_t>& head_strides);

// `dim` of t, negative dims counted from the end; raises when out of range.
int64_t thd_wrap_dim(int64_t dim, const at::Tensor& t);

// cu: a contiguous 1-D int32 tensor on ref's device, of `numel` entries (any when negative).
void thd_check_cu(const at::Tensor& cu, const at::Tensor& ref, int64_t numel, const char* name);

// A row map of `kind` over cu (every cu pointer at cu, one rank), and the identity map.
ThdRowMapParams thd_map(ThdRowMap kind, const at::Tensor& cu);
ThdRowMapParams thd_identity_map();

// The ThdDtype of a merge / grad row tensor (bf16, fp16, fp32); raises otherwise.
int32_t thd_math_dtype(const at::Tensor& t, const char* name);

// A row index of merge_rows / add_rows: contiguous int64 [n] on the data's device.
bool thd_is_row_index(const at::Tensor& idx, const at::Tensor& data, int64_t n);

}  // namespace rocm_attn::bindings
