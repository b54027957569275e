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
