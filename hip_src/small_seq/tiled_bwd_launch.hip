// Launch of the tiled small-seq backward: a switch on the call's plan (plan.h; made by
// rocm_attn/small_seq_plan.py), its launches in stream order. The kernels a plan names: the
// Delta pass, the dK/dV pass (its one-row-tile instance where every (segment, kv head) fits one
// row tile, with Delta fused where every history fits one key tile) and the dQ pass
// (tiled_bwd_kernel.h; pass 3 by its block variant only), the block variants
// (tiled_bwd_block_kernel.h), the streaming kernel for a few rows per (segment, kv head)
// (tiled_bwd_stream_kernel.h), and on Hopper (sm_90a builds) the warpgroup-MMA kernels
// (tiled_bwd_warpgroup_tma_kernel.h, tiled_bwd_warpgroup_two_tile_kernel.h,
// tiled_bwd_warpgroup_dq_stream_kernel.h). The launcher
// checks the plan against what this build compiled and chooses nothing else, except the plan's
// fallback where a tile-copy kernel's tensor maps cannot be made. Dispatch over dtype x head
// dim (one translation unit: no kv bucket, no generated files).
#include "../common/launch.h"
#include "plan.h"
#include "tiled_bwd_block_kernel.h"
#include "tiled_bwd_stream_kernel.h"
#include "tiled_bwd_warpgroup_dq_stream_kernel.h"
#include "tiled_bwd_warpgroup_tma_kernel.h"
#include "tiled_bwd_warpgroup_two_tile_kernel.h"
#include "tiled_launch_util.h"

namespace small_seq {
namespace {

// A plan's launch that this build has no kernel for, or that the call or device cannot take.
constexpr hipError_t kNoKernel = hipErrorNotSupported;
constexpr hipError_t kBadPlan = hipErrorInvalidValue;

// Blocks for `items` work items, items_per_block per block: at most kTiledBwdResidencyFactor x
// the blocks resident at once (the grid-stride loops then re-use them), at least one.
template <auto KERNEL>
dim3 tiled_bwd_grid(int64_t items, int64_t items_per_block, int threads) {
  int64_t blocks = (items + items_per_block - 1) / items_per_block;
  const int64_t cap = ra_resident_blocks<KERNEL>(threads) * kTiledBwdResidencyFactor;
  if (cap > 0 && blocks > cap) blocks = cap;
  return dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1));
}

static_assert(kTiledBwdRowTileThreads <= kTiledBwdMaxThreadsPerBlock, "pass 2's thread bound");

// Launches KERNEL with `threads` threads and `smem` bytes of dynamic shared memory over `items`
// work items: one block per item up to kTiledBwdResidencyFactor x the blocks resident at once.
template <auto KERNEL, typename... Extra>
hipError_t run_tiled_bwd_staged(const SmallSeqTiledParams& p, int64_t items, int threads,
                                int64_t smem, hipStream_t stream, const Extra&... extra) {
  if (smem > ra_device_max_shared_per_block()) return kBadPlan;
  const hipError_t err = tiled_allow_shared<KERNEL>(smem);
  if (err != hipSuccess) return err;
  static TiledOccupancyCache occupancy;
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(KERNEL, threads, smem, occupancy)) *
      ra_device_multiprocessors();
  hipLaunchKernelGGL(KERNEL, tiled_capped_grid(items, resident, kTiledBwdResidencyFactor),
                     dim3(threads), static_cast<size_t>(smem), stream, p, extra...);
  return hipGetLastError();
}

#if RA_TMA_BUILD
// Tensor maps of q, dout and (with_dq) dq with the warpgroup kernels' Q box (tiled_tma_q_map);
// false where the GQA group does not divide a 64-row tile or a map cannot be made (a pointer or
// stride not a multiple of 16 bytes): the plan's fallback (the wave / block kernels) serves.
template <int D>
bool tiled_bwd_tma_maps(const SmallSeqTiledParams& p, const bool with_dq, TiledBwdTmaMaps* maps) {
  const int group = p.num_heads_q / p.num_heads_kv;
  if (kTiledWarpgroupRows % group != 0) return false;
  const bool ok =
      tiled_tma_q_map(&maps->q, p, p.q, D, p.q_batch_stride, p.q_token_stride,
                      p.q_head_stride) &&
      tiled_tma_q_map(&maps->dout, p, p.dout, D, p.do_batch_stride, p.do_token_stride,
                      p.do_head_stride) &&
      (!with_dq || tiled_tma_q_map(&maps->dq, p, p.dq, D, p.dq_batch_stride, p.dq_token_stride,
                                   p.dq_head_stride));
  if (!with_dq) maps->dq = maps->q;  // never stored through
  return ok;
}
#endif

// The warpgroup dK / dV kernel (WITH_DQ: over (segment, kv head) items, dQ included; else over
// (segment, kv head, key block) items), its whole row tiles moved by tile copies.
template <typename T, int D, int KEYS, bool WITH_DQ, bool FUSED_DELTA, bool TRANSPOSED>
hipError_t run_tiled_bwd_warpgroup_dkdv(const SmallSeqTiledParams& p, hipStream_t stream) {
#if RA_TMA_BUILD
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t items = WITH_DQ ? pairs : pairs * tiled_bwd_warpgroup_blocks(p.max_seqlen_kv);
  TiledBwdTmaMaps maps;
  if (!tiled_bwd_tma_maps<D>(p, WITH_DQ, &maps)) return kBadPlan;
  return run_tiled_bwd_staged<
      small_seq_tiled_bwd_warpgroup_tma_kernel<T, D, KEYS, WITH_DQ, FUSED_DELTA, TRANSPOSED>>(
      p, items, 128, tiled_bwd_warpgroup_smem_bytes<D>(KEYS), stream, maps);
#else
  return kNoKernel;
#endif
}

// The warpgroup dQ kernel over (segment, kv head) items, its score products m64n64 per key
// block, tiles by tile copies; it computes Delta (run ahead of the dK / dV kernel, pass 1 not
// launched).
template <typename T, int D>
hipError_t run_tiled_bwd_warpgroup_dq(const SmallSeqTiledParams& p, hipStream_t stream) {
#if RA_TMA_BUILD
  constexpr int kThreads = kTiledBwdWarpgroupDqWarpgroups * 128;
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  TiledBwdTmaMaps maps;
  if (!tiled_bwd_tma_maps<D>(p, false, &maps)) return kBadPlan;
  return run_tiled_bwd_staged<small_seq_tiled_bwd_warpgroup_dq_tma_kernel<T, D>>(
      p, pairs, kThreads, tiled_bwd_warpgroup_dq_tma_smem_bytes<D>(p.max_seqlen_kv), stream,
      maps);
#else
  return kNoKernel;
#endif
}

// The warpgroup dQ kernel with K / V streamed through a ring, over (segment, kv head, pair of
// row tiles) items; it computes Delta as run_tiled_bwd_warpgroup_dq's.
template <typename T, int D>
hipError_t run_tiled_bwd_warpgroup_dq_stream(const SmallSeqTiledParams& p, hipStream_t stream) {
  constexpr int kThreads = kTiledBwdWarpgroupDqWarpgroups * 128;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv *
                        tiled_bwd_dq_stream_groups(tiled_max_rows(p));
  return run_tiled_bwd_staged<small_seq_tiled_bwd_warpgroup_dq_stream_kernel<T, D>>(
      p, items, kThreads, tiled_bwd_warpgroup_dq_stream_smem_bytes<D>(), stream);
}

// A warpgroup dK / dV record (KEYS, WITH_DQ, FUSED_DELTA, TRANSPOSED): the instances the plan
// can name. Histories of one key block: with dQ, 16- or 64-key products, Delta fused; past one
// block (Delta from pass 1 or the dQ kernel): the one-tile walk (with dQ, transposed) or
// key-block items (no dQ, transposed, the dQ kernel beside them).
template <typename T, int D>
hipError_t run_tiled_bwd_warpgroup_record(const SmallSeqTiledParams& p, const int32_t* a,
                                          hipStream_t stream) {
  const int keys = a[1];
  const bool with_dq = a[2] != 0, fused = a[3] != 0, transposed = a[4] != 0;
  if (with_dq && fused && !transposed) {
    if (keys == 16) {
      if (p.max_seqlen_kv > 16) return kBadPlan;
      return run_tiled_bwd_warpgroup_dkdv<T, D, 16, true, true, false>(p, stream);
    }
    if (keys != kTiledBwdWarpgroupBlockKeys) return kNoKernel;
    if (p.max_seqlen_kv > kTiledBwdWarpgroupBlockKeys) return kBadPlan;
    return run_tiled_bwd_warpgroup_dkdv<T, D, 64, true, true, false>(p, stream);
  }
  if (keys != kTiledBwdWarpgroupBlockKeys || fused || !transposed) return kNoKernel;
  if (p.max_seqlen_kv > kTiledBwdWarpgroupMaxKeys) return kBadPlan;
  if (with_dq) {  // the one-tile walk: every item at most one row tile
    if (tiled_max_rows(p) > kTiledWarpgroupRows) return kBadPlan;
    return run_tiled_bwd_warpgroup_dkdv<T, D, 64, true, false, true>(p, stream);
  }
  return run_tiled_bwd_warpgroup_dkdv<T, D, 64, false, false, true>(p, stream);
}

// The streaming kernel: work items (segment, kv head) one per wave where there are at least
// kTiledBwdStreamWaveItems x the waves resident at once (item_per 0), else one per block, its
// waves splitting the keys; item_per 1 / 2 forces one per wave / per block.
template <auto KERNEL>
hipError_t run_tiled_bwd_stream_kernel(const SmallSeqTiledParams& p, int item_per,
                                       hipStream_t stream) {
  static TiledOccupancyCache occupancy;
  const int threads = kTiledBwdStreamThreads;
  const int waves = threads / ra_device_wave_size();
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(KERNEL, threads, 0, occupancy)) *
      ra_device_multiprocessors();
  const bool per_wave =
      item_per == 1 || (item_per == 0 && items >= kTiledBwdStreamWaveItems * resident * waves);
  const int64_t items_per_block = per_wave ? waves : 1;
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  hipLaunchKernelGGL(KERNEL, tiled_capped_grid(blocks, resident, kTiledBwdResidencyFactor),
                     dim3(threads), 0, stream, p, !per_wave);
  return hipGetLastError();
}

// The kernel instance of ROWS rows (1 or kTiledBwdStreamMaxRows), which must hold the host
// bound.
template <typename T, int D>
hipError_t run_tiled_bwd_stream(const SmallSeqTiledParams& p, int rows, int item_per,
                                hipStream_t stream) {
  if (tiled_max_rows(p) > rows || item_per < 0 || item_per > 2) return kBadPlan;
  switch (rows) {
    case 1:
      return run_tiled_bwd_stream_kernel<small_seq_tiled_bwd_stream_kernel<T, D, 1>>(
          p, item_per, stream);
    case kTiledBwdStreamMaxRows:
      return run_tiled_bwd_stream_kernel<
          small_seq_tiled_bwd_stream_kernel<T, D, kTiledBwdStreamMaxRows>>(p, item_per, stream);
    default: return kNoKernel;
  }
}

// Pass 2's one-row-tile instance (pass 3 has no work), Delta fused (histories of one key tile)
// or from pass 1.
template <typename T, int D, bool FUSED_DELTA>
hipError_t run_tiled_bwd_row_tile(const SmallSeqTiledParams& p, hipStream_t stream) {
  constexpr auto kernel = small_seq_tiled_bwd_dkv_kernel<T, D, true, FUSED_DELTA>;
  constexpr int kThreads = kTiledBwdRowTileThreads;
  const int wave = ra_device_wave_size();
  if (tiled_max_rows(p) > kTiledBwdRows || (FUSED_DELTA && p.max_seqlen_kv > kTiledBwdKeys))
    return kBadPlan;
  hipLaunchKernelGGL(kernel, (tiled_bwd_grid<kernel>(
                                 tiled_bwd_dkv_items(p, tiled_bwd_slices(wave, D)),
                                 kThreads / wave, kThreads)),
                     dim3(kThreads), 0, stream, p);
  return hipGetLastError();
}

// Pass 1: Delta = rowsum(dO O) - dlse into the workspace.
template <typename T, int D>
hipError_t run_tiled_bwd_delta(const SmallSeqTiledParams& p, hipStream_t stream) {
  const int wave = ra_device_wave_size();
  const int threads = kTiledBwdWavesPerBlock * wave;
  const int per_wave = wave / (D / 8 < wave ? D / 8 : wave);  // (row, head) pairs per wave
  const int64_t items = (tiled_bwd_delta_pairs(p) + per_wave - 1) / per_wave;
  if (items == 0) return hipSuccess;
  hipLaunchKernelGGL((small_seq_tiled_bwd_delta_kernel<T, D>),
                     (tiled_bwd_grid<small_seq_tiled_bwd_delta_kernel<T, D>>(
                         items, threads / wave, threads)),
                     dim3(threads), 0, stream, p);
  return hipGetLastError();
}

// Pass 2's general instance and the block variants of passes 2 and 3.
template <typename T, int D>
hipError_t run_tiled_bwd_pass(const SmallSeqTiledParams& p, SmallSeqKernel kernel,
                              hipStream_t stream) {
  const int wave = ra_device_wave_size();
  const int threads = kTiledBwdWavesPerBlock * wave;
  const int slices = tiled_bwd_slices(wave, D);
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  switch (kernel) {
    case SmallSeqKernel::kTiledBwdDkv:
      hipLaunchKernelGGL((small_seq_tiled_bwd_dkv_kernel<T, D>),
                         (tiled_bwd_grid<small_seq_tiled_bwd_dkv_kernel<T, D>>(
                             tiled_bwd_dkv_items(p, slices), threads / wave, threads)),
                         dim3(threads), 0, stream, p);
      break;
    case SmallSeqKernel::kTiledBwdDkvBlock: {
      constexpr auto k = small_seq_tiled_bwd_dkv_block_kernel<T, D>;
      constexpr int kThreads = kTiledBwdBlockThreads;
      const int64_t items =
          pairs * tiled_bwd_dkv_block_groups(p, tiled_bwd_block_tiles(kThreads, wave, D));
      hipLaunchKernelGGL(k, (tiled_bwd_grid<k>(items, 1, kThreads)), dim3(kThreads), 0, stream,
                         p);
      break;
    }
    case SmallSeqKernel::kTiledBwdDqBlock: {
      constexpr auto k = small_seq_tiled_bwd_dq_block_kernel<T, D>;
      constexpr int kThreads = kTiledBwdDqBlockThreads;
      const int64_t items =
          pairs * tiled_bwd_dq_block_groups(p, tiled_bwd_block_tiles(kThreads, wave, D));
      hipLaunchKernelGGL(k, (tiled_bwd_grid<k>(items, 1, kThreads)), dim3(kThreads), 0, stream,
                         p);
      break;
    }
    default: return kNoKernel;
  }
  return hipGetLastError();
}

// One launch record of the plan (a[0] = D, then the kernel's parameters).
template <typename T, int D>
hipError_t run_tiled_bwd_record(const SmallSeqTiledParams& p, const SmallSeqLaunch& l,
                                hipStream_t stream) {
  const int32_t* a = l.p;
  if (a[0] != D) return kBadPlan;
  const SmallSeqKernel kernel = static_cast<SmallSeqKernel>(l.kernel);
  switch (kernel) {
    case SmallSeqKernel::kTiledBwdDelta: return run_tiled_bwd_delta<T, D>(p, stream);
    case SmallSeqKernel::kTiledBwdDkv:
      if (a[1] == 0) return a[2] != 0 ? kNoKernel : run_tiled_bwd_pass<T, D>(p, kernel, stream);
      return a[2] != 0 ? run_tiled_bwd_row_tile<T, D, true>(p, stream)
                       : run_tiled_bwd_row_tile<T, D, false>(p, stream);
    case SmallSeqKernel::kTiledBwdDkvBlock:
    case SmallSeqKernel::kTiledBwdDqBlock: return run_tiled_bwd_pass<T, D>(p, kernel, stream);
    case SmallSeqKernel::kTiledBwdStream: return run_tiled_bwd_stream<T, D>(p, a[1], a[2], stream);
    default: break;
  }
  if constexpr (D <= 128) {
    if (!ra_device_warpgroup_mma()) return kNoKernel;
    switch (kernel) {
      case SmallSeqKernel::kTiledBwdWarpgroupTma:
        return run_tiled_bwd_warpgroup_record<T, D>(p, a, stream);
      case SmallSeqKernel::kTiledBwdWarpgroupDqTma:
        if (p.max_seqlen_kv > kTiledBwdWarpgroupStagedMaxKeys) return kBadPlan;
        return run_tiled_bwd_warpgroup_dq<T, D>(p, stream);
      case SmallSeqKernel::kTiledBwdWarpgroupDqStream:
        if (p.max_seqlen_kv > kTiledBwdWarpgroupMaxKeys) return kBadPlan;
        return run_tiled_bwd_warpgroup_dq_stream<T, D>(p, stream);
      case SmallSeqKernel::kTiledBwdWarpgroupTwoTile: {
        const int64_t rows = tiled_max_rows(p);
        if (rows > kTiledBwdTwoTileRows || p.max_seqlen_kv > kTiledBwdWarpgroupMaxKeys)
          return kBadPlan;
        return run_tiled_bwd_staged<small_seq_tiled_bwd_warpgroup_two_tile_kernel<T, D>>(
            p, static_cast<int64_t>(p.batch) * p.num_heads_kv, 2 * 128,
            tiled_bwd_two_tile_smem_bytes<D>(), stream);
      }
      default: break;
    }
  }
  return kNoKernel;
}

// Whether every tile-copy launch among `n` records from `first` can make its tensor maps.
template <int D>
bool tiled_bwd_maps_ok(const SmallSeqTiledParams& p, const SmallSeqLaunch* first, int n) {
  for (int i = 0; i < n; ++i) {
    const SmallSeqKernel kernel = static_cast<SmallSeqKernel>(first[i].kernel);
    if (kernel != SmallSeqKernel::kTiledBwdWarpgroupTma &&
        kernel != SmallSeqKernel::kTiledBwdWarpgroupDqTma)
      continue;
#if RA_TMA_BUILD
    TiledBwdTmaMaps maps;
    const bool with_dq = kernel == SmallSeqKernel::kTiledBwdWarpgroupTma && first[i].p[2] != 0;
    if (!tiled_bwd_tma_maps<D>(p, with_dq, &maps)) return false;
#else
    return false;
#endif
  }
  return true;
}

template <typename T, int D>
hipError_t run_tiled_bwd(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                         hipStream_t stream) {
  if (plan.launches < 1) return kBadPlan;
  if (p.batch == 0 || p.num_heads_kv == 0) return hipSuccess;
  if (p.workspace == nullptr || p.workspace_elems < tiled_bwd_delta_pairs(p))
    return hipErrorInvalidValue;  // Delta lives there ([h_q, total_q] fp32)
  const SmallSeqLaunch* first = plan.launch;
  int n = plan.launches;
  if (!tiled_bwd_maps_ok<D>(p, first, n)) {
    if (plan.fallbacks < 1) return kBadPlan;  // the plan names no kernel for these tensors
    first = plan.launch + plan.launches;
    n = plan.fallbacks;
  }
  for (int i = 0; i < n; ++i) {
    const hipError_t err = run_tiled_bwd_record<T, D>(p, first[i], stream);
    if (err != hipSuccess) return err;
  }
  return hipSuccess;
}

template <typename T>
hipError_t run_tiled_bwd_dim(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                             int head_dim, hipStream_t stream) {
  switch (head_dim) {
    case 64: return run_tiled_bwd<T, 64>(p, plan, stream);
    case 128: return run_tiled_bwd<T, 128>(p, plan, stream);
    case 256: return run_tiled_bwd<T, 256>(p, plan, stream);
    default: return hipErrorInvalidValue;  // callers validate first (small_seq_tiled_supports)
  }
}

}  // namespace
}  // namespace small_seq

hipError_t small_seq_tiled_bwd_launch(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                                      SmallSeqTiledDtype dtype, int head_dim,
                                      hipStream_t stream) {
  if (!small_seq_tiled_supports(head_dim) || p.max_seqlen_kv > kSmallSeqTiledMaxSeqlenKv ||
      p.max_seqlen_q < 1 || p.max_seqlen_kv < 1)
    return hipErrorInvalidValue;
  return dtype == SmallSeqTiledDtype::kBFloat16
             ? small_seq::run_tiled_bwd_dim<ra_bf16>(p, plan, head_dim, stream)
             : small_seq::run_tiled_bwd_dim<ra_fp16>(p, plan, head_dim, stream);
}
