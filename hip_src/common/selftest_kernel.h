// Device test of the compat.h building blocks (tests/test_common_gpu.py).
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

constexpr int kSelftestOutputs = 18;

// One wave: bf16_in/fp16_in/x hold wave-width values (bf16_in at least 32 for the vector part);
// out [wave, kSelftestOutputs] float; vec_out [wave, 8] raw bf16 bits.
hipError_t compat_selftest_launch(const uint16_t* bf16_in, const uint16_t* fp16_in,
                                  const float* x, float* out, uint16_t* vec_out,
                                  hipStream_t stream);

// Device test of the matrix-unit API (mma.h) on one wave, in the shapes the small-seq forward
// uses: X rows<D, HB> and Y rows<D, KV> -> S = X Y^T (acc of NS = 8 or 16 columns), P = S rounded
// to 16 bits (rows < HB), O = P V with V vrows<D, KV>. HB = max(heads, the hardware's narrowest
// tile). Inputs x, y, v: [16, D] raw 16-bit bits (bf16, or fp16 when `fp16`); rows of y >= ny,
// of v >= nv are not read; o rows >= no are not written.
// Outputs (pre-filled by the caller): s [16, 16] float, cover [16, 16] int32 (zeros; +1 per
// accumulator element a lane holds there), o [16, D] 16-bit bits, rowstat [16, 3] float
// ([r, 0:2]: row max / row sum of S row r over the accumulator's columns, from the row
// reductions; [c, 2]: sum of S column c over its 16 rows, from ra_mma_col_sum), info [4]
// int32: {1 if the device pass has matrix units else 0, columns of the accumulator (NS, or 16
// where the hardware has no narrower tile), HB, wave width}.
// Returns hipErrorInvalidValue for shapes it was not compiled for (d 64/128/256, kv 4/8/16,
// heads 8/16).
hipError_t mma_selftest_launch(const uint16_t* x, const uint16_t* y, const uint16_t* v, int d,
                               int kv, int heads, int ny, int nv, int no, bool fp16, float* s,
                               int32_t* cover, uint16_t* o, float* rowstat, int32_t* info,
                               hipStream_t stream);
