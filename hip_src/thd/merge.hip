// Launchers of the THD merge / correction kernels: 8-element vectors when every row allows
// them, else scalar; the row dtypes as template arguments for the common combinations
// (kThdAnyDtype, read at run time, for the rest and for scalar rows).
#include "../common/tuning.h"
#include "launch_grid.h"
#include "merge_kernel.h"
#include "merge_wide_kernel.h"

namespace {

using thd::grid_for;
using thd::ptr_aligned16;
using thd::resident_waves;

// Items per merge tile (log2): a whole wave of items, one owner lane each, halved while the
// tiles would fill at most half of the resident waves: a small launch then spreads its items
// over more waves, each with less serial work.
// NOTE: half-wave tiles gain on the small cp8 launch; the grad kernel's rule (tiles that still
// fill every resident wave) went down to eighth-wave tiles there and lost, as did half tiles on
// the larger launches, which whole-wave tiles already fill (docs/kernels.md#thd-merge-kernels).
int merge_tile_shift(int64_t items, int wave) {
  const int64_t waves = resident_waves(wave);
  int s = thd::log2_pow2(wave);
  while (s > 0 && 2 * (items >> s) <= waves) --s;
  return s;
}

template <int SDT>
hipError_t launch_merge_wide(const ThdMergeParams& p, const thd::WideGrid& g, hipStream_t stream) {
  const int64_t guess_blocks =
      ra_device_overlapped_launch() && p.map.kind == ThdRowMap::kHalf
          ? ra_resident_blocks<thd::merge_wide_kernel<kThdFloat32, SDT>>(thd::kMergeThreads)
          : 0;
  return ra_launch(thd::merge_wide_kernel<kThdFloat32, SDT>,
                   dim3(static_cast<unsigned>(g.blocks)), dim3(thd::kMergeThreads), stream, p,
                   g.pieces_shift, guess_blocks);
}

// merge_wide_kernel for fp32 rows (halves or whole) of a wave of 8-element vectors or more,
// heads of 3 vectors or more (24 elements on 32-lane waves) that no piece boundary splits
// (tuning thd_merge_wide = 0 turns it off); false: the caller launches the tile kernel.
bool launch_merge_wide(const ThdMergeParams& p, hipStream_t stream, hipError_t& err) {
  const int wave = ra_device_wave_size();
  const int64_t nvec = static_cast<int64_t>(p.heads) * (p.dim / 8);
  const int64_t per_wave = static_cast<int64_t>(wave) * thd::kWideVecsPerLane;
  // a piece's heads (per_wave / nv + 1 at most) must fit the owner lanes of its wave, and no
  // head may straddle two pieces: each would own it, and in place the later one could read the
  // LSE the other has already merged
  const int64_t nv = p.dim / 8;
  if (ra_tuning().thd_merge_wide == 0 || p.out_dtype != kThdFloat32 || nvec < wave ||
      per_wave / nv + 1 > wave || (nvec > per_wave && per_wave % nv != 0) ||
      (p.map.kind != ThdRowMap::kHalf && p.map.kind != ThdRowMap::kIdentity))
    return false;
  const thd::WideGrid g =
      thd::wide_grid(p.n, nvec, wave, thd::kMergeThreads, thd::kWideVecsPerLane);
  if (g.blocks < 0) return false;
  switch (p.step_dtype) {
    case kThdBFloat16:
      err = launch_merge_wide<kThdBFloat16>(p, g, stream);
      return true;
    case kThdFloat16:
      err = launch_merge_wide<kThdFloat16>(p, g, stream);
      return true;
    case kThdFloat32:
      err = launch_merge_wide<kThdFloat32>(p, g, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace

hipError_t thd_merge_launch(const ThdMergeParams& p, hipStream_t stream) {
  if (p.n <= 0 || p.heads <= 0) return hipSuccess;
  if (p.lse == nullptr || p.lse_step == nullptr) return hipErrorInvalidValue;
  const bool rows = p.out_dst != nullptr;
  if (rows && (p.out == nullptr || p.out_step == nullptr || p.dim <= 0))
    return hipErrorInvalidValue;
  if (p.map.kind != ThdRowMap::kIdentity && p.map.kind != ThdRowMap::kHalf &&
      p.map.kind != ThdRowMap::kIndex)
    return hipErrorInvalidValue;
  if (p.map.kind == ThdRowMap::kIndex &&
      (p.map.index == nullptr || p.map.local_rows <= 0 ||
       (p.map.step_index != nullptr && p.map.step_count <= 0)))
    return hipErrorInvalidValue;
  // 32-bit item and row indices in the kernel (64-bit pointer offsets)
  const int64_t items = p.n * p.heads;
  if (items >= INT32_MAX || p.map.local_rows >= INT32_MAX || p.map.step_count >= INT32_MAX)
    return hipErrorInvalidValue;
  // 8-element vectors: 16 bytes of a 16-bit row, two 16-byte halves of an fp32 row.
  bool vec8 = rows && p.dim % 8 == 0 && ptr_aligned16(p.out) && ptr_aligned16(p.out_step) &&
              ptr_aligned16(p.out_dst);
  for (int64_t s : {p.out_tok, p.out_head, p.step_tok, p.step_head, p.dst_tok, p.dst_head})
    vec8 = vec8 && s % 8 == 0;
  hipError_t err = hipSuccess;
  if (vec8 && launch_merge_wide(p, stream, err)) return err;
  const int vec = vec8 ? 8 : 1;
  const int wave = ra_device_wave_size();
  // lanes per item: about one vector each (the kernel caps it at the wave)
  const int shift = rows ? thd::lanes_shift(p.dim / vec, 1, thd::kMergeThreads) : 0;
  const int tshift = merge_tile_shift(items, wave);
  // units batches per lane put in L2 before the wait (ROCM_ATTN_THD_PREFETCH: 0 none)
  const int prefetch_batches = thd::thd_prefetch_setting(thd::kMergePrefetchBatches);
  const dim3 grid = grid_for(items, tshift, wave);
  const dim3 block(thd::kMergeThreads);
#define RA_THD_MERGE(VEC, ODT, SDT) \
  return ra_launch(thd::merge_kernel<VEC, ODT, SDT>, grid, block, stream, p, shift, tshift, \
                   prefetch_batches)
  const int od = p.out_dtype, sd = p.step_dtype;
  if (!vec8) {
    RA_THD_MERGE(1, thd::kThdAnyDtype, thd::kThdAnyDtype);
  } else if (od == kThdBFloat16 && sd == kThdBFloat16) {
    RA_THD_MERGE(8, kThdBFloat16, kThdBFloat16);
  } else if (od == kThdFloat16 && sd == kThdFloat16) {
    RA_THD_MERGE(8, kThdFloat16, kThdFloat16);
  } else if (od == kThdFloat32 && sd == kThdBFloat16) {
    RA_THD_MERGE(8, kThdFloat32, kThdBFloat16);
  } else if (od == kThdFloat32 && sd == kThdFloat16) {
    RA_THD_MERGE(8, kThdFloat32, kThdFloat16);
  } else if (od == kThdFloat32 && sd == kThdFloat32) {
    RA_THD_MERGE(8, kThdFloat32, kThdFloat32);
  } else {
    RA_THD_MERGE(8, thd::kThdAnyDtype, thd::kThdAnyDtype);
  }
#undef RA_THD_MERGE
}
