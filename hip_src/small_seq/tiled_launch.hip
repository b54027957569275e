// Launch of the tiled small-seq forward (tiled_fwd_kernel.h, tiled_fwd_resident_kernel.h,
// tiled_fwd_warpgroup_kernel.h, their tile-copy and warp-specialized variants): a switch on the
// call's plan (plan.h; made by rocm_attn/small_seq_plan.py, which chooses the kernel, its template
// parameters and its grid factor), the grid sized from occupancy. The launcher checks the plan
// against what this build compiled and the device allows, and chooses nothing else, except the
// plan's fallback where a tile-copy kernel's tensor maps cannot be made. Per dtype: three wave
// kernels (d 64, 128, 256) and, for d 64 and 128, the block kernel of 256 threads staged
// through registers (CUDA builds add its two-warp instance staged by cp.async), resident
// kernels of 256 threads and key steps of 16 and 64, and the one-warpgroup kernel of 16-key
// steps (CUDA sm_90a builds add the tile-copy instances of 16- and 64-key steps and the
// streaming instance, and at d 128 the warp-specialized kernel); one translation unit: the
// kernels have no kv bucket, so the variant count stays small and needs no generated
// instantiation files. Every instance whose histories may take more than one key step has a
// ROW_MAX twin (the record's last parameter: the plan's choice for calls that ask for each
// row's maximum logit, tiled_fwd_kernel.h's header NOTE); the one-step instances (the wave
// kernel's one-tile instance, the 16-key warpgroup instances) serve those calls as they are.
#include "plan.h"
#include "tiled_fwd_warpgroup_kernel.h"
#include "tiled_fwd_warpgroup_tma_kernel.h"
#include "tiled_fwd_warpgroup_ws_kernel.h"
#include "tiled_launch_util.h"

namespace small_seq {
namespace {

// A plan's launch that this build has no kernel for, or that the call or device cannot take.
constexpr hipError_t kNoKernel = hipErrorNotSupported;
constexpr hipError_t kBadPlan = hipErrorInvalidValue;

// Blocks for `items` work items of `items_per_block` each (no dynamic shared memory), at most
// `factor` x the blocks resident at once (0: no cap).
template <typename Kernel>
dim3 tiled_grid(Kernel kernel, int64_t items, int items_per_block, int threads, int factor,
                TiledOccupancyCache& cache) {
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  if (factor <= 0) return tiled_capped_grid(blocks, 0, 0);
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(kernel, threads, 0, cache)) *
      ra_device_multiprocessors();
  return tiled_capped_grid(blocks, resident, factor);
}

// Splits per (segment, kv head) of the kernels that stage a segment's K/V per work item
// (resident, warpgroup): enough for about kTiledResidentItemsPerBlock items per resident block
// when there are few segments, while every split keeps each of a block's `workers` (waves or
// warpgroups) busy with at least one of the segment's `tiles` row tiles.
inline int64_t tiled_splits(const SmallSeqTiledParams& p, int64_t tiles, int workers,
                            int64_t resident) {
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t max_splits = tiles / workers > 1 ? tiles / workers : 1;
  const int64_t splits = (kTiledResidentItemsPerBlock * resident + pairs - 1) / pairs;
  return splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
}

// Launches a kernel that stages a (segment, kv head)'s K/V per work item (resident, warpgroup)
// with `smem` bytes of shared memory (arguments p, splits, then `extra`): as many blocks as stay
// resident (capped at `factor` x them), each (segment, kv head) split over tiled_splits items
// of row tiles of `tile_rows` among the block's `workers` (waves or warpgroups), or with
// tiles_per_item > 0 into items of that many row tiles (kernels that stream K/V per item: the
// warpgroup kernel's streaming instance, one; the warp-specialized kernel over long histories,
// one per computing warpgroup).
template <auto KERNEL, int THREADS, typename... Extra>
hipError_t run_tiled_fwd_staged(const SmallSeqTiledParams& p, int64_t smem, int tile_rows,
                                int workers, int tiles_per_item, int factor, hipStream_t stream,
                                const Extra&... extra) {
  if (smem > ra_device_max_shared_per_block()) return kBadPlan;
  const hipError_t err = tiled_allow_shared<KERNEL>(smem);
  if (err != hipSuccess) return err;
  static TiledOccupancyCache occupancy;
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(KERNEL, THREADS, smem, occupancy)) *
      ra_device_multiprocessors();
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t tiles = tiled_row_tiles(p, tile_rows);
  const int64_t splits = tiles_per_item > 0 ? (tiles + tiles_per_item - 1) / tiles_per_item
                                            : tiled_splits(p, tiles, workers, resident);
  const dim3 grid = tiled_capped_grid(pairs * splits, resident, factor);
  hipLaunchKernelGGL(KERNEL, grid, dim3(THREADS), static_cast<size_t>(smem), stream, p,
                     static_cast<int>(splits), extra...);
  return hipGetLastError();
}

template <typename T, int D, int KSTEP, bool ROW_MAX>
hipError_t run_tiled_fwd_resident(const SmallSeqTiledParams& p, int factor, hipStream_t stream) {
  return run_tiled_fwd_staged<small_seq_tiled_fwd_resident_kernel<T, D, KSTEP, ROW_MAX>,
                              kTiledResidentThreads>(
      p, tiled_resident_smem_bytes<D>(p.max_seqlen_kv), kTiledResidentRows,
      kTiledResidentThreads / ra_device_wave_size(), 0, factor, stream);
}

// The cp.async warpgroup kernel (16-key steps).
template <typename T, int D>
hipError_t run_tiled_fwd_warpgroup(const SmallSeqTiledParams& p, int factor,
                                   hipStream_t stream) {
  return run_tiled_fwd_staged<small_seq_tiled_fwd_warpgroup_kernel<T, D>, 128>(
      p, tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, 1), kTiledWarpgroupRows, 1, 0, factor,
      stream);
}

#if RA_TMA_BUILD
// Tensor maps of a call for the tile-copy kernels (q / out: tiled_tma_q_map; k / v boxes of one
// step's KEYS keys); false where TMA cannot describe one of them.
template <int D, int KEYS>
bool tiled_tma_maps(const SmallSeqTiledParams& p, TiledTmaMaps* maps) {
  // THD k / v are one batch of all rows, BSHD ones [b, s_kv, h_kv, d].
  const int64_t kv_batch = p.cu_seqlens_kv != nullptr ? 1 : p.batch;
  return tiled_tma_q_map(&maps->q, p, p.q, D, p.q_batch_stride, p.q_token_stride,
                         p.q_head_stride) &&
         tiled_tma_q_map(&maps->o, p, p.o, D, p.o_batch_stride, p.o_token_stride,
                         p.o_head_stride) &&
         ra_tma_map_16bit(&maps->k, p.k, kv_batch, p.total_kv, p.num_heads_kv, D,
                          p.k_batch_stride, p.k_token_stride, p.k_head_stride, 1, KEYS) &&
         ra_tma_map_16bit(&maps->v, p.v, kv_batch, p.total_kv, p.num_heads_kv, D,
                          p.v_batch_stride, p.v_token_stride, p.v_head_stride, 1, KEYS);
}
#endif

#if RA_TMA_BUILD
// The warpgroup kernel staged by tile copies (tiled_fwd_warpgroup_tma_kernel.h); false (nothing
// launched) where q, k, v or out have no tensor map (an address or stride not a multiple of 16
// bytes). STREAM: the streaming instance (64-key steps, one row tile per item).
template <typename T, int D, int KEYS, bool CAPPED, bool STREAM, bool ROW_MAX>
bool run_tiled_fwd_warpgroup_tma(const SmallSeqTiledParams& p, int factor, hipStream_t stream,
                                 hipError_t* err) {
  const int group = p.num_heads_q / p.num_heads_kv;
  const int64_t smem = STREAM ? tiled_stream_smem_bytes<D>()
                              : tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, 1);
  if (kTiledWarpgroupRows % group != 0 ||
      (!STREAM && tiled_warpgroup_keys(p.max_seqlen_kv) / KEYS > kTiledTmaMaxSteps) ||
      smem + tiled_tma_static_bytes() > ra_device_max_shared_per_block()) {
    *err = kBadPlan;
    return true;
  }
  TiledTmaMaps maps;
  if (!tiled_tma_maps<D, KEYS>(p, &maps)) return false;
  *err = run_tiled_fwd_staged<
      small_seq_tiled_fwd_warpgroup_tma_kernel<T, D, KEYS, CAPPED, STREAM, ROW_MAX>, 128>(
      p, smem, kTiledWarpgroupRows, 1, STREAM ? 1 : 0, factor, stream, maps);
  return true;
}

// The warp-specialized kernel (tiled_fwd_warpgroup_ws_kernel.h); false (nothing launched) where
// the tensors have no tensor maps. Histories past its ring stream in items of a pair of row
// tiles (tiled_ws_tiles_per_item).
template <typename T, int D, bool ROW_MAX>
bool run_tiled_fwd_warpgroup_ws(const SmallSeqTiledParams& p, int factor, hipStream_t stream,
                                hipError_t* err) {
  const int group = p.num_heads_q / p.num_heads_kv;
  const int64_t smem = tiled_ws_smem_bytes<D>();
  if (kTiledWarpgroupRows % group != 0 ||
      smem + kTiledSharedReserve > ra_device_max_shared_per_block()) {
    *err = kBadPlan;
    return true;
  }
  TiledTmaMaps maps;
  if (!tiled_tma_maps<D, kTiledWarpgroupKeys>(p, &maps)) return false;
  *err = run_tiled_fwd_staged<small_seq_tiled_fwd_warpgroup_ws_kernel<T, D, ROW_MAX>,
                              kTiledWsThreads>(
      p, smem, kTiledWarpgroupRows, kTiledWsComputeWarpgroups,
      tiled_ws_tiles_per_item(p.max_seqlen_kv), factor, stream, maps);
  return true;
}
#endif

template <typename T, int D, int THREADS, bool CP_ASYNC, bool ROW_MAX>
hipError_t run_tiled_fwd_block(const SmallSeqTiledParams& p, int wave, int factor,
                               hipStream_t stream) {
  static TiledOccupancyCache occupancy;
  const int waves = THREADS / wave;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv *
                        ((tiled_row_tiles(p, tiled_rows_for_wave(wave)) + waves - 1) / waves);
  const dim3 grid = tiled_grid(
      small_seq_tiled_fwd_block_kernel<T, D, THREADS, CP_ASYNC, ROW_MAX>, items, 1, THREADS,
      factor, occupancy);
  hipLaunchKernelGGL((small_seq_tiled_fwd_block_kernel<T, D, THREADS, CP_ASYNC, ROW_MAX>), grid,
                     dim3(THREADS), 0, stream, p);
  return hipGetLastError();
}

// The wave kernel; ONE_TILE: its instance for histories of one key tile.
template <typename T, int D, bool ONE_TILE, bool ROW_MAX>
hipError_t run_tiled_fwd_wave(const SmallSeqTiledParams& p, int wave, int factor,
                              hipStream_t stream) {
  if (ONE_TILE && p.max_seqlen_kv > kTiledKeys) return kBadPlan;
  static TiledOccupancyCache occupancy;
  const dim3 block(kTiledWavesPerBlock * wave);
  const dim3 grid = tiled_grid(small_seq_tiled_fwd_kernel<T, D, ONE_TILE, ROW_MAX>,
                               tiled_fwd_items(p, tiled_rows_for_wave(wave)), kTiledWavesPerBlock,
                               static_cast<int>(block.x), factor, occupancy);
  hipLaunchKernelGGL((small_seq_tiled_fwd_kernel<T, D, ONE_TILE, ROW_MAX>), grid, block, 0,
                     stream, p);
  return hipGetLastError();
}

#if RA_TMA_BUILD
// The tile-copy warpgroup kernel of a launch record (KEYS, CAPPED, STREAM): staged 16- and
// 64-key steps, capped; the streaming instance (ROW_MAX: the 64-key ones' twins). False where
// the tensors have no tensor maps.
template <typename T, int D, bool ROW_MAX>
bool run_tiled_fwd_warpgroup_tma_record(const SmallSeqTiledParams& p, const int32_t* a,
                                        int factor, hipStream_t stream, hipError_t* err) {
  const int keys = a[1];
  const bool capped = a[2] != 0, stream_items = a[3] != 0;
  if (stream_items && keys == 64 && !capped)
    return run_tiled_fwd_warpgroup_tma<T, D, 64, false, true, ROW_MAX>(p, factor, stream, err);
  if constexpr (!ROW_MAX) {  // one step: no twin
    if (!stream_items && keys == 16 && capped)
      return run_tiled_fwd_warpgroup_tma<T, D, 16, true, false, false>(p, factor, stream, err);
  }
  if (!stream_items && keys == 64 && capped)
    return run_tiled_fwd_warpgroup_tma<T, D, 64, true, false, ROW_MAX>(p, factor, stream, err);
  *err = kNoKernel;
  return true;
}
#endif

// A record's ROW_MAX (its last parameter; false for the kernel without one).
inline bool tiled_fwd_record_row_max(const SmallSeqLaunch& l) {
  const int32_t* a = l.p;
  switch (static_cast<SmallSeqKernel>(l.kernel)) {
    case SmallSeqKernel::kTiledFwdWave: return a[3] != 0;
    case SmallSeqKernel::kTiledFwdBlock: return a[4] != 0;
    case SmallSeqKernel::kTiledFwdResident: return a[3] != 0;
    case SmallSeqKernel::kTiledFwdWarpgroupTma: return a[5] != 0;
    case SmallSeqKernel::kTiledFwdWarpgroupWs: return a[3] != 0;
    default: return false;
  }
}

// One launch record of the plan (ROW_MAX: its flag, tiled_fwd_record_row_max). *no_maps: a
// tile-copy kernel whose tensor maps could not be made (nothing launched; the caller runs the
// plan's fallback).
template <typename T, int D, bool ROW_MAX>
hipError_t run_tiled_fwd_record(const SmallSeqTiledParams& p, const SmallSeqLaunch& l,
                                hipStream_t stream, bool* no_maps) {
  const int32_t* a = l.p;  // a[0] = D, then the kernel's parameters
  if (a[0] != D) return kBadPlan;
  const int wave = ra_device_wave_size();
  switch (static_cast<SmallSeqKernel>(l.kernel)) {
    case SmallSeqKernel::kTiledFwdWave:
      if constexpr (D <= 128 && !ROW_MAX) {  // the one-tile instance has no twin
        if (a[1] != 0) return run_tiled_fwd_wave<T, D, true, false>(p, wave, a[2], stream);
      } else {
        if (a[1] != 0) return kNoKernel;
      }
      return run_tiled_fwd_wave<T, D, false, ROW_MAX>(p, wave, a[2], stream);
    default: break;
  }
  if constexpr (D <= 128) {
    switch (static_cast<SmallSeqKernel>(l.kernel)) {
      case SmallSeqKernel::kTiledFwdBlock:
        // many rows: 256 threads through registers; few rows (CUDA builds): two warps by cp.async
        if (a[1] == 256 && a[2] == 0)
          return run_tiled_fwd_block<T, D, 256, false, ROW_MAX>(p, wave, a[3], stream);
#if RA_CP_ASYNC_BUILD
        if (a[1] == 64 && a[2] != 0)
          return run_tiled_fwd_block<T, D, 64, true, ROW_MAX>(p, wave, a[3], stream);
#endif
        return kNoKernel;
      case SmallSeqKernel::kTiledFwdResident:
        if (a[1] == 1) return run_tiled_fwd_resident<T, D, 1, ROW_MAX>(p, a[2], stream);
        if (a[1] == 4) return run_tiled_fwd_resident<T, D, 4, ROW_MAX>(p, a[2], stream);
        return kNoKernel;
      case SmallSeqKernel::kTiledFwdWarpgroup:
        if (!ra_device_warpgroup_mma() || p.probs != nullptr) return kNoKernel;
        return run_tiled_fwd_warpgroup<T, D>(p, a[1], stream);
#if RA_TMA_BUILD
      case SmallSeqKernel::kTiledFwdWarpgroupTma: {
        if (!ra_device_warpgroup_mma() || p.probs != nullptr) return kNoKernel;
        hipError_t err = hipSuccess;
        *no_maps = !run_tiled_fwd_warpgroup_tma_record<T, D, ROW_MAX>(p, a, a[4], stream, &err);
        return err;
      }
      case SmallSeqKernel::kTiledFwdWarpgroupWs: {
        if constexpr (D == 128) {
          if (!ra_device_warpgroup_mma() || p.probs != nullptr) return kNoKernel;
          hipError_t err = hipSuccess;
          // QUEUE (a[2]): the binding's zeroed counter in p.work_queue, else none
          if ((a[2] != 0) != (p.work_queue != nullptr)) return kBadPlan;
          *no_maps = !run_tiled_fwd_warpgroup_ws<T, D, ROW_MAX>(p, a[1], stream, &err);
          return err;
        }
        return kNoKernel;
      }
#endif
      default: break;
    }
  }
  return kNoKernel;
}

template <typename T, int D>
hipError_t run_tiled_fwd_any_record(const SmallSeqTiledParams& p, const SmallSeqLaunch& l,
                                    hipStream_t stream, bool* no_maps) {
  return tiled_fwd_record_row_max(l) ? run_tiled_fwd_record<T, D, true>(p, l, stream, no_maps)
                                     : run_tiled_fwd_record<T, D, false>(p, l, stream, no_maps);
}

template <typename T, int D>
hipError_t run_tiled_fwd(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                         hipStream_t stream) {
  if (plan.launches != 1 || plan.fallbacks > 1) return kBadPlan;
  if (p.batch == 0 || p.num_heads_kv == 0) return hipSuccess;
  bool no_maps = false;
  const hipError_t err = run_tiled_fwd_any_record<T, D>(p, plan.launch[0], stream, &no_maps);
  if (!no_maps) return err;
  if (plan.fallbacks != 1) return kBadPlan;  // the plan names no kernel for these tensors
  no_maps = false;
  const hipError_t fallback =
      run_tiled_fwd_any_record<T, D>(p, plan.launch[1], stream, &no_maps);
  return no_maps ? kBadPlan : fallback;
}

template <typename T>
hipError_t run_tiled_fwd_dim(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                             int head_dim, hipStream_t stream) {
  switch (head_dim) {
    case 64: return run_tiled_fwd<T, 64>(p, plan, stream);
    case 128: return run_tiled_fwd<T, 128>(p, plan, stream);
    case 256: return run_tiled_fwd<T, 256>(p, plan, stream);
    default: return hipErrorInvalidValue;  // callers validate first (small_seq_tiled_supports)
  }
}

}  // namespace
}  // namespace small_seq

hipError_t small_seq_tiled_fwd_launch(const SmallSeqTiledParams& p, const SmallSeqPlan& plan,
                                      SmallSeqTiledDtype dtype, int head_dim,
                                      hipStream_t stream) {
  if (!small_seq_tiled_supports(head_dim) || p.max_seqlen_kv > kSmallSeqTiledMaxSeqlenKv ||
      p.max_seqlen_q < 1 || p.max_seqlen_kv < 1)
    return hipErrorInvalidValue;
  return dtype == SmallSeqTiledDtype::kBFloat16
             ? small_seq::run_tiled_fwd_dim<ra_bf16>(p, plan, head_dim, stream)
             : small_seq::run_tiled_fwd_dim<ra_fp16>(p, plan, head_dim, stream);
}
