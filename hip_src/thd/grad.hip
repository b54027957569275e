// Launchers of the THD gradient kernels (grad_correction, add_rows): the wide kernel for rows
// of a wave of 8-element vectors or more, else the tile kernel with 8-element vectors when every
// row allows them, else scalar; the row dtypes as template arguments for the common
// combinations (kThdAnyDtype, read at run time, for the rest and for scalar rows).
#include "../common/tuning.h"
#include "grad_kernel.h"
#include "grad_wide_kernel.h"
#include "launch_grid.h"

namespace {

using thd::grid_for;
using thd::ptr_aligned16;
using thd::resident_waves;

// Items per wave tile (log2, <= log2(wave)): the largest tile that still leaves a full
// residency of waves to spread the items over.
int tile_shift_for(int64_t items, int wave) {
  const int64_t want_waves = resident_waves(wave);
  int s = 0;
  while ((1 << (s + 1)) <= wave && (items >> (s + 1)) >= want_waves) ++s;
  return s;
}

template <int GDT, int SDT>
hipError_t launch_grad_wide(const ThdGradParams& p, const thd::WideGrid& g, int hshift,
                            int only_half, hipStream_t stream) {
  const int64_t guess_blocks =
      ra_device_overlapped_launch() && p.map.kind == ThdRowMap::kHalf
          ? ra_resident_blocks<thd::grad_wide_kernel<GDT, SDT>>(thd::kMergeThreads)
          : 0;
  return ra_launch(thd::grad_wide_kernel<GDT, SDT>, dim3(static_cast<unsigned>(g.blocks)),
                   dim3(thd::kMergeThreads), stream, p, g.pieces_shift, hshift, only_half,
                   guess_blocks, thd::thd_prefetch_setting(1));
}

// grad_wide_kernel for halves or whole rows of a wave of 8-element vectors or more, one dtype
// for grad and step (tuning thd_grad_wide = 0 turns it off); false: the caller launches the
// tile kernel.
bool launch_grad_wide(const ThdGradParams& p, int64_t nvec, hipStream_t stream,
                      hipError_t& err) {
  const int wave = ra_device_wave_size();
  if (ra_tuning().thd_grad_wide == 0 || nvec < wave || p.grad_dtype != p.step_dtype ||
      (p.map.kind != ThdRowMap::kHalf && p.map.kind != ThdRowMap::kIdentity))
    return false;
  const bool halves = p.map.kind == ThdRowMap::kHalf;
  const bool move0 = p.op0 != kThdGradNone || p.copy_none;
  const bool move1 = halves && (p.op1 != kThdGradNone || p.copy_none);
  if (!move0 && !move1) {
    err = hipSuccess;
    return true;
  }
  const int hshift = move0 && move1 ? 1 : 0;
  const int only_half = move0 ? 0 : 1;
  const thd::WideGrid g =
      thd::wide_grid(p.n << hshift, nvec, wave, thd::kMergeThreads, thd::kGradWideVecsPerLane);
  if (g.blocks < 0) return false;
  switch (p.grad_dtype) {
    case kThdBFloat16:
      err = launch_grad_wide<kThdBFloat16, kThdBFloat16>(p, g, hshift, only_half, stream);
      return true;
    case kThdFloat16:
      err = launch_grad_wide<kThdFloat16, kThdFloat16>(p, g, hshift, only_half, stream);
      return true;
    case kThdFloat32:
      err = launch_grad_wide<kThdFloat32, kThdFloat32>(p, g, hshift, only_half, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace

hipError_t thd_grad_launch(const ThdGradParams& p, hipStream_t stream) {
  if (p.n <= 0 || p.heads <= 0 || p.head_dim <= 0) return hipSuccess;
  if (p.map.kind != ThdRowMap::kIdentity && p.map.kind != ThdRowMap::kHalf &&
      p.map.kind != ThdRowMap::kIndex)
    return hipErrorInvalidValue;
  if (p.map.kind == ThdRowMap::kIndex &&
      (p.map.index == nullptr || p.map.local_rows <= 0 ||
       (p.map.step_index != nullptr && p.map.step_count <= 0)))
    return hipErrorInvalidValue;
  // 32-bit k and row indices in the kernel (64-bit pointer offsets)
  if (p.n >= INT32_MAX || p.map.local_rows >= INT32_MAX || p.map.step_count >= INT32_MAX)
    return hipErrorInvalidValue;
  bool vec8 = p.head_dim % 8 == 0 && ptr_aligned16(p.grad) && ptr_aligned16(p.step) &&
              ptr_aligned16(p.dst) && p.grad_tok % 8 == 0 && p.step_tok % 8 == 0 &&
              p.dst_tok % 8 == 0;
  if (p.heads > 1)
    vec8 = vec8 && p.grad_head % 8 == 0 && p.step_head % 8 == 0 && p.dst_head % 8 == 0;
  const int vec = vec8 ? 8 : 1;
  const int64_t nvec = static_cast<int64_t>(p.heads) * (p.head_dim / vec);
  if (nvec > INT32_MAX / 2) return hipErrorInvalidValue;
  hipError_t err = hipSuccess;
  if (vec8 && launch_grad_wide(p, nvec, stream, err)) return err;
  const int wave = ra_device_wave_size();
  // NOTE: a whole wave of k per tile (as the merge kernel) leaves too few waves: it reached
  // under half this tile's share of the floor (docs/kernels.md#thd-grad-kernels).
  const int tshift = tile_shift_for(p.n, wave);
  const dim3 grid = grid_for(p.n, tshift, wave);
  const dim3 block(thd::kMergeThreads);
  const int rows = p.map.kind == ThdRowMap::kIndex ? thd::kGradRowsIndexed
                   : p.map.kind == ThdRowMap::kHalf && ra_device_overlapped_launch() &&
                           grid.x <= static_cast<unsigned>(ra_device_multiprocessors() *
                                                           thd::kGradSnapshotBlocksPerSM)
                       ? thd::kGradRowsSnapshot
                       : thd::kGradRowsDirect;
#define RA_THD_GRAD_ROWS(VEC, GDT, SDT, ROWS) \
  ra_launch(thd::grad_kernel<VEC, GDT, SDT, thd::ROWS>, grid, block, stream, p, tshift)
#define RA_THD_GRAD(VEC, GDT, SDT)                                             \
  return rows == thd::kGradRowsIndexed   ? RA_THD_GRAD_ROWS(VEC, GDT, SDT, kGradRowsIndexed)  \
         : rows == thd::kGradRowsSnapshot ? RA_THD_GRAD_ROWS(VEC, GDT, SDT, kGradRowsSnapshot) \
                                          : RA_THD_GRAD_ROWS(VEC, GDT, SDT, kGradRowsDirect)
  const int gd = p.grad_dtype, sd = p.step_dtype;
  if (!vec8) {
    RA_THD_GRAD(1, thd::kThdAnyDtype, thd::kThdAnyDtype);
  } else if (gd == kThdBFloat16 && sd == kThdBFloat16) {
    RA_THD_GRAD(8, kThdBFloat16, kThdBFloat16);
  } else if (gd == kThdFloat16 && sd == kThdFloat16) {
    RA_THD_GRAD(8, kThdFloat16, kThdFloat16);
  } else if (gd == kThdFloat32 && sd == kThdFloat32) {
    RA_THD_GRAD(8, kThdFloat32, kThdFloat32);
  } else {
    RA_THD_GRAD(8, thd::kThdAnyDtype, thd::kThdAnyDtype);
  }
#undef RA_THD_GRAD
#undef RA_THD_GRAD_ROWS
}
