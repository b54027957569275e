// The tiled small-seq contract around a flash-attention call (the flash route of
// rocm_attn/small_seq_flash.py): what the tiled kernels would have written that flash does not.
//
// The route runs torch's flash varlen kernels on "flash offsets": each of cu_seqlens_q /
// cu_seqlens_kv clamped into its tensor and made non-decreasing (a running maximum), so flash
// reads and writes only rows inside q, k, v whatever the offsets hold. Where the offsets are
// valid the flash offsets equal them and flash computes every segment. These kernels then run
// once per segment, like the tiled kernels' segment check (tiled_segment.h, same contract):
//   * a bad segment is counted (tiled_report_bad_segment) and gets NaN on the rows the tiled
//     forward writes NaN to (out and lse) and on those rows' dq; zero dk / dv on its keys
//     (cu_seqlens_kv[seg] .. [seg + 1] clamped into k, when ordered);
//   * a valid segment whose flash offsets differ from its own (its rows or keys overlap an
//     earlier segment's: possible only when some segment is bad, so the call is flagged)
//     was computed by flash on the wrong rows or keys: NaN on its out, lse and dq rows and on
//     its keys' dk / dv, never a silently wrong value;
//   * a valid segment without keys: out 0 and lse -inf on its rows (flash writes lse +inf
//     there), dq 0; without queries: dk / dv 0 on its keys;
//   * padding rows of q (before cu_seqlens_q[0], from cu_seqlens_q[b] on): out 0, lse -inf,
//     dq 0; k / v rows before cu_seqlens_kv[0] and from cu_seqlens_kv[b] on: dk / dv 0
//     (flash allocates its outputs uninitialised and writes only its segments' rows).
// A block per segment (grid-stride); its threads share the row writes. A valid call costs each
// block six offset reads and no write.
#pragma once

#include "../common/compat.h"
#include "tiled_segment.h"

namespace small_seq {

// Rows [row0, row0 + rows) x `heads` heads of a 16-bit [rows, heads, vecs * 8] tensor set to
// the 16-bit pattern `bits`, the block's threads striding over the 16-byte vectors.
RA_DEVICE void flash_contract_fill_rows(void* base, int64_t token_stride, int64_t head_stride,
                                        int64_t row0, int64_t rows, int heads, int vecs,
                                        uint16_t bits) {
  if (rows <= 0) return;
  const uint32_t w = static_cast<uint32_t>(bits) | (static_cast<uint32_t>(bits) << 16);
  const int64_t per_row = static_cast<int64_t>(heads) * vecs;
  uint16_t* x = static_cast<uint16_t*>(base);
  for (int64_t idx = threadIdx.x; idx < rows * per_row; idx += blockDim.x) {
    const int64_t r = idx / per_row;
    const int rem = static_cast<int>(idx - r * per_row);
    const int h = rem / vecs;
    const int vec = rem - h * vecs;
    ra_store16(x + (row0 + r) * token_stride + h * head_stride + 8 * vec, ra_vec8{{w, w, w, w}});
  }
}

// Entries [row0, row0 + rows) of every head of the [h_q, total_q] LSE set to `value`.
RA_DEVICE void flash_contract_fill_lse(const SmallSeqTiledParams& p, int64_t row0, int64_t rows,
                                       float value) {
  if (rows <= 0) return;
  for (int64_t idx = threadIdx.x; idx < rows * p.num_heads_q; idx += blockDim.x) {
    const int64_t h = idx / rows;
    p.lse[h * p.lse_head_stride + row0 + (idx - h * rows)] = value;
  }
}

// Forward: rows [row0, row0 + rows) of out (all q heads) set to the 16-bit pattern `bits` and
// of the LSE to `lse`.
RA_DEVICE void flash_contract_fill_out(const SmallSeqTiledParams& p, int64_t row0, int64_t rows,
                                       int vecs, uint16_t bits, float lse) {
  flash_contract_fill_rows(p.o, p.o_token_stride, p.o_head_stride, row0, rows, p.num_heads_q,
                           vecs, bits);
  flash_contract_fill_lse(p, row0, rows, lse);
}

// Backward: k / v rows [row0, row0 + rows) of dk and dv (all kv heads) set to `bits`.
RA_DEVICE void flash_contract_fill_dkv(const SmallSeqTiledParams& p, int64_t row0, int64_t rows,
                                       int vecs, uint16_t bits) {
  flash_contract_fill_rows(p.dk, p.dk_token_stride, p.dk_head_stride, row0, rows,
                           p.num_heads_kv, vecs, bits);
  flash_contract_fill_rows(p.dv, p.dv_token_stride, p.dv_head_stride, row0, rows,
                           p.num_heads_kv, vecs, bits);
}

// Backward: rows [row0, row0 + rows) of dq (all q heads) set to `bits`.
RA_DEVICE void flash_contract_fill_dq(const SmallSeqTiledParams& p, int64_t row0, int64_t rows,
                                      int vecs, uint16_t bits) {
  flash_contract_fill_rows(p.dq, p.dq_token_stride, p.dq_head_stride, row0, rows, p.num_heads_q,
                           vecs, bits);
}

// Whether flash served segment `seg` on exactly its own rows and keys.
RA_DEVICE bool flash_contract_exact(const TiledBounds& b, const TiledSegment& s,
                                    const int32_t* flash_cu_q, const int32_t* flash_cu_kv,
                                    int seg) {
  return s.valid && flash_cu_q[seg] == b.q0 && flash_cu_q[seg + 1] == b.q1 &&
         flash_cu_kv[seg] == b.k0 && flash_cu_kv[seg + 1] == b.k1;
}

// Forward: out ([total_q, h_q, d], strides o_*) and lse as the tiled forward leaves them.
template <typename T>
__global__ void small_seq_flash_contract_fwd_kernel(SmallSeqTiledParams p,
                                                    const int32_t* flash_cu_q,
                                                    const int32_t* flash_cu_kv, int vecs) {
  const uint16_t nan_bits = ra_dtype<T>::from_float(tiled_nan());
  const float neg_inf = -__int_as_float(0x7f800000);
  for (int seg = blockIdx.x; seg < p.batch; seg += gridDim.x) {
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (!s.valid && threadIdx.x == 0) tiled_report_bad_segment(p, seg);
    if (!flash_contract_exact(b, s, flash_cu_q, flash_cu_kv, seg))
      flash_contract_fill_out(p, s.q_row0, s.nq, vecs, nan_bits, tiled_nan());
    else if (s.nk == 0)
      flash_contract_fill_out(p, s.q_row0, s.nq, vecs, 0, neg_inf);
    // padding rows of q
    if (seg == 0) flash_contract_fill_out(p, 0, tiled_padding_rows(p).lead_end, vecs, 0, neg_inf);
    if (seg == p.batch - 1) {
      const int64_t tail = tiled_padding_rows(p).tail_begin;
      flash_contract_fill_out(p, tail, p.total_q - tail, vecs, 0, neg_inf);
    }
  }
}

// Backward: dq ([total_q, h_q, d], strides dq_*), dk and dv ([total_kv, h_kv, d]) as the tiled
// backward leaves them.
template <typename T>
__global__ void small_seq_flash_contract_bwd_kernel(SmallSeqTiledParams p,
                                                    const int32_t* flash_cu_q,
                                                    const int32_t* flash_cu_kv, int vecs) {
  const uint16_t nan_bits = ra_dtype<T>::from_float(tiled_nan());
  for (int seg = blockIdx.x; seg < p.batch; seg += gridDim.x) {
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    const bool exact = flash_contract_exact(b, s, flash_cu_q, flash_cu_kv, seg);
    // dk / dv of this segment's keys: zero for a bad segment (when ordered) and for a valid
    // one without queries, NaN for a valid one that flash computed on other rows or keys (a
    // bad segment is never exact).
    const int64_t k0 = tiled_clamp_row(b.k0, p.total_kv);
    const int64_t k1 = tiled_clamp_row(b.k1, p.total_kv);
    if (!exact || s.nq == 0)
      flash_contract_fill_dkv(p, k0, k1 - k0, vecs, s.valid && !exact ? nan_bits : 0);
    // dq of its rows: NaN unless flash computed them, zero where the segment has no key.
    if (!exact || s.nk == 0)
      flash_contract_fill_dq(p, s.q_row0, s.nq, vecs, exact ? 0 : nan_bits);
    // padding: q rows and k / v rows outside every segment
    if (seg == 0) {
      flash_contract_fill_dq(p, 0, tiled_padding_rows(p).lead_end, vecs, 0);
      flash_contract_fill_dkv(p, 0, tiled_kv_offset_clamped(p, 0), vecs, 0);
    }
    if (seg == p.batch - 1) {
      const int64_t tail = tiled_padding_rows(p).tail_begin;
      flash_contract_fill_dq(p, tail, p.total_q - tail, vecs, 0);
      const int64_t tail_kv = tiled_kv_offset_clamped(p, p.batch);
      flash_contract_fill_dkv(p, tail_kv, p.total_kv - tail_kv, vecs, 0);
    }
  }
}

// Flash offsets of both sides in one launch: out[side * (b + 1) + i] = max over j <= i of
// offsets[j] clamped into [0, total] (side 0: cu_seqlens_q into total_q, side 1: cu_seqlens_kv
// into total_kv), as int32. Block `side` does one side: each thread takes a run of consecutive
// entries, the block scans the runs' maxima (kFlashOffsetsThreads of them, in shared memory),
// and each thread writes its run from the maximum of the runs before it. For valid offsets the
// result equals the offsets. One launch instead of the four torch ops per side (cast, clamp,
// running maximum, cast) that each cost a launch on the route's short calls.
constexpr int kFlashOffsetsThreads = 256;

__global__ void __launch_bounds__(kFlashOffsetsThreads)
    small_seq_flash_offsets_kernel(SmallSeqTiledParams p, int32_t* out) {
  __shared__ int64_t run_max[kFlashOffsetsThreads];
  const bool kv = blockIdx.x == 1;
  const void* base = kv ? p.cu_seqlens_kv : p.cu_seqlens_q;
  const bool is64 = kv ? p.cu_seqlens_kv_int64 : p.cu_seqlens_q_int64;
  const int64_t total = kv ? p.total_kv : p.total_q;
  const int64_t n = static_cast<int64_t>(p.batch) + 1;
  const int64_t per_thread = (n + kFlashOffsetsThreads - 1) / kFlashOffsetsThreads;
  const int64_t i0 = threadIdx.x * per_thread;
  const int64_t i1 = i0 + per_thread < n ? i0 + per_thread : n;
  int64_t m = 0;  // clamped values are >= 0
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t x = tiled_clamp_row(tiled_read_offset(base, is64, i), total);
    m = x > m ? x : m;
  }
  run_max[threadIdx.x] = m;
  __syncthreads();
  // inclusive max-scan of the runs' maxima (Hillis-Steele: read, sync, write, sync)
  for (int step = 1; step < kFlashOffsetsThreads; step *= 2) {
    const int64_t other = threadIdx.x >= step ? run_max[threadIdx.x - step] : 0;
    __syncthreads();
    if (other > run_max[threadIdx.x]) run_max[threadIdx.x] = other;
    __syncthreads();
  }
  int64_t running = threadIdx.x > 0 ? run_max[threadIdx.x - 1] : 0;
  int32_t* dst = out + (kv ? n : 0);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t x = tiled_clamp_row(tiled_read_offset(base, is64, i), total);
    running = x > running ? x : running;
    dst[i] = static_cast<int32_t>(running);
  }
}

}  // namespace small_seq
