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

namespace rocm_attn::bindings {

inline hipStream_t current_stream(const at::Device& device) {
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
  return static_cast<hipStream_t>(stream.native_handle());
}

inline void check_launch(hipError_t err, const char* what) {
  TORCH_CHECK(err == hipSuccess, "rocm_attn: ", what, " failed: ", hipGetErrorString(err));
}

}  // namespace rocm_attn::bindings
