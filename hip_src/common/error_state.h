// Device-side contract violations (bad per-segment lengths that only the device can see).
// Kernels count them into a per-device buffer; the host reads it on request
// (rocm_attn.check_errors), so the default path never synchronises.
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

// [0]: number of bad segments since the last reset; [1]: INT32_MAX - lowest bad segment index
// (0 when none). A module-scope __device__ array: zero at load, one per device, no allocation,
// so it is safe to use inside graph capture.
int32_t* ra_error_state_ptr();

// Copies the two counters to the host, merged over every device a kernel has counted on (each
// one synchronised; the current device is restored), and optionally clears them.
hipError_t ra_error_state_read(int32_t out[2], bool reset);
