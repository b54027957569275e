// Launcher of the THD row gather/scatter kernels: the wide-row kernel (copy_wide_kernel.h) over
// rows of a wave of 16-byte vectors or more; else the row-group kernel with the widest vector
// the row layout allows (16, 8, 4 or 2 bytes) and its lanes per row. Nine instantiations in all.
#include "../common/tuning.h"
#include "copy_kernel.h"
#include "copy_wide_kernel.h"

namespace {

bool aligned(int64_t v, int bytes) { return v % bytes == 0; }

// Widest vector (bytes) dividing the segment size, both base pointers and every stride in use.
int copy_vector_bytes(const ThdCopyParams& p) {
  const int64_t src = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.src));
  const int64_t dst = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.dst));
  for (int v = 16; v >= 2; v /= 2) {
    bool ok = aligned(p.head_bytes, v) && aligned(src, v) && aligned(dst, v) &&
              aligned(p.src_row_stride, v) && aligned(p.dst_row_stride, v);
    if (p.outer > 1) ok = ok && aligned(p.src_outer_stride, v) && aligned(p.dst_outer_stride, v);
    if (p.heads > 1) ok = ok && aligned(p.src_head_stride, v) && aligned(p.dst_head_stride, v);
    if (ok) return v;
  }
  return 0;
}

template <ThdRowMap KIND>
hipError_t launch_wide_kind(const ThdCopyParams& p, const thd::WideGrid& g, hipStream_t stream) {
  // the first resident round maps its rows before the wait; later blocks start after the
  // kernel ahead has ended and would only pay for the snapshot
  const int64_t guess_blocks =
      ra_device_overlapped_launch()
          ? ra_resident_blocks<thd::copy_wide_rows_kernel<KIND>>(thd::kCopyThreads)
          : 0;
  // L2 prefetch of the guessed rows (copy_wide_kernel.h), except where the whole grid is one
  // resident round: there it cost read_half cp8 6-9% (H200)
  const int prefetch = g.blocks > guess_blocks ? thd::thd_prefetch_setting(1) : 0;
  return ra_launch(thd::copy_wide_rows_kernel<KIND>, dim3(static_cast<unsigned>(g.blocks)),
                   dim3(thd::kCopyThreads), stream, p, g.pieces_shift, guess_blocks, prefetch);
}

// copy_wide_rows_kernel where rows hold a wave of 16-byte vectors and the grid fits (tuning
// thd_copy_wide = 0 turns it off); false: the caller launches the row-group kernel.
bool launch_wide(const ThdCopyParams& p, int64_t nvec, hipStream_t stream, hipError_t& err) {
  const int wave = ra_device_wave_size();
  if (ra_tuning().thd_copy_wide == 0 || nvec < wave) return false;
  if (p.rows > (int64_t{1} << 40) / p.outer) return false;
  const thd::WideGrid g = thd::wide_grid(p.outer * p.rows, nvec, wave, thd::kCopyThreads,
                                         thd::kWideVecsPerLane);
  if (g.blocks < 0) return false;
  switch (p.map.kind) {
    case ThdRowMap::kPartition:
      err = launch_wide_kind<ThdRowMap::kPartition>(p, g, stream);
      return true;
    case ThdRowMap::kHalf:
      err = launch_wide_kind<ThdRowMap::kHalf>(p, g, stream);
      return true;
    case ThdRowMap::kCopyValid:
      err = launch_wide_kind<ThdRowMap::kCopyValid>(p, g, stream);
      return true;
    case ThdRowMap::kToContiguous:
      err = launch_wide_kind<ThdRowMap::kToContiguous>(p, g, stream);
      return true;
    case ThdRowMap::kToRankSharded:
      err = launch_wide_kind<ThdRowMap::kToRankSharded>(p, g, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace

hipError_t thd_copy_rows_launch(const ThdCopyParams& p, hipStream_t stream) {
  if (p.rows <= 0 || p.outer <= 0 || p.heads <= 0 || p.head_bytes <= 0) return hipSuccess;
  const int vbytes = copy_vector_bytes(p);
  if (vbytes == 0) return hipErrorInvalidValue;  // 1-byte elements or odd strides
  const int64_t nvec = static_cast<int64_t>(p.heads) * (p.head_bytes / vbytes);
  if (nvec > INT32_MAX) return hipErrorInvalidValue;
  hipError_t err = hipSuccess;
  if (vbytes == 16 && launch_wide(p, nvec, stream, err)) return err;
  const int shift = thd::lanes_shift(nvec, thd::kCopyVecsPerLane, thd::kCopyThreads);
  const int64_t rows_per_block = thd::kCopyThreads >> shift;
  const int64_t bx = (p.rows + rows_per_block - 1) / rows_per_block;
  const int64_t by = (p.outer + thd::kCopyOuterPerBlock - 1) / thd::kCopyOuterPerBlock;
  // Both loops are grid-strided, so clipping the grid only serialises work.
  const dim3 grid(static_cast<unsigned>(bx < INT32_MAX ? bx : INT32_MAX),
                  static_cast<unsigned>(by < 65535 ? by : 65535));
  const dim3 block(thd::kCopyThreads);
  const int first_wave_blocks =
      ra_device_overlapped_launch() ? ra_device_multiprocessors() * thd::kCopyResidentBlocks : 0;
  switch (vbytes) {
    case 16:
      return ra_launch(thd::copy_rows_kernel<16>, grid, block, stream, p, shift, first_wave_blocks);
    case 8:
      return ra_launch(thd::copy_rows_kernel<8>, grid, block, stream, p, shift, first_wave_blocks);
    case 4:
      return ra_launch(thd::copy_rows_kernel<4>, grid, block, stream, p, shift, first_wave_blocks);
    default:
      return ra_launch(thd::copy_rows_kernel<2>, grid, block, stream, p, shift, first_wave_blocks);
  }
}
