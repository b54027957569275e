#include "error_state.h"

__device__ int32_t ra_error_state[2];

int32_t* ra_error_state_ptr() {
  constexpr int kMaxDevices = 64;
  static int32_t* cache[kMaxDevices] = {};
  int device = 0;
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= kMaxDevices) return nullptr;
  if (cache[device] == nullptr) {
    void* ptr = nullptr;
    if (hipGetSymbolAddress(&ptr, (const void*)&ra_error_state) != hipSuccess) return nullptr;
    cache[device] = static_cast<int32_t*>(ptr);
  }
  return cache[device];
}

hipError_t ra_error_state_read(int32_t out[2], bool reset) {
  int32_t* ptr = ra_error_state_ptr();
  if (ptr == nullptr) return hipErrorInvalidValue;
  hipError_t err = hipMemcpy(out, ptr, 2 * sizeof(int32_t), hipMemcpyDeviceToHost);
  if (err != hipSuccess || !reset) return err;
  return hipMemset(ptr, 0, 2 * sizeof(int32_t));
}
