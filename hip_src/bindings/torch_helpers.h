// What every bindings file needs: the torch headers the ops use, the current stream of a device
// and the check of a launcher's result. Only hip_src/bindings/ includes torch; the kernels and
// their launchers under hip_src/ never do.
// NOTE: a failed check whose message streamed a number once segfaulted on the GPU image: its
// toolchain links libstdc++ statically, so the extension carried its own stream code next to
// torch's (setup.py loaded_libstdcxx links the process's shared libstdc++ instead).
#pragma once

#include <hip/hip_runtime.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "common/error_state.h"

namespace rocm_attn::bindings {

inline hipStream_t current_stream(const at::Device& device) {
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
  return static_cast<hipStream_t>(stream.native_handle());
}

// 16-byte vector access needs 16-byte aligned rows: base pointer and every stride but the last.
// `op` prefixes the message ("small_seq", "small_seq_tiled", ...), `name` is the argument.
inline void check_rows_16b(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.stride(-1) == 1, op, ": ", name, " must have a contiguous last dim");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name,
              " must be 16-byte aligned");
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    TORCH_CHECK(t.stride(i) % 8 == 0 || t.size(i) == 1, op, ": ", name,
                " strides must be multiples of 8 elements");
}

inline void check_launch(hipError_t err, const char* what) {
  TORCH_CHECK(err == hipSuccess, "rocm_attn: ", what, " failed: ", hipGetErrorString(err));
}

// The kernels' error counter on t's device (its address differs per device: a kernel on one
// GPU must not count into another's), whichever device is current.
inline int32_t* device_error_state(const at::Tensor& t, const char* op) {
  const c10::DeviceGuard guard(t.device());
  int32_t* state = ra_error_state_ptr();
  TORCH_CHECK(state != nullptr, op, ": could not reach the device error counter");
  return state;
}

}  // namespace rocm_attn::bindings
