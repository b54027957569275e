#include "error_state.h"

__device__ int32_t ra_error_state[2];

namespace {

constexpr int kMaxDevices = 64;
// The counter's address on every device a kernel has reached it from (nullptr: never).
int32_t* g_cache[kMaxDevices] = {};

}  // namespace

int32_t* ra_error_state_ptr() {
  int device = 0;
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= kMaxDevices) return nullptr;
  if (g_cache[device] == nullptr) {
    void* ptr = nullptr;
    if (hipGetSymbolAddress(&ptr, (const void*)&ra_error_state) != hipSuccess) return nullptr;
    g_cache[device] = static_cast<int32_t*>(ptr);
  }
  return g_cache[device];
}

hipError_t ra_error_state_read(int32_t out[2], bool reset) {
  // NOTE: every device a kernel has counted on, not only the current one: a process that runs
  // kernels on several GPUs must see all their errors in one check. Devices no kernel reached
  // are skipped, so a read never creates a context on another GPU.
  out[0] = 0;
  out[1] = 0;
  int current = 0;
  hipError_t err = hipGetDevice(&current);
  if (err != hipSuccess) return err;
  if (current >= 0 && current < kMaxDevices && g_cache[current] == nullptr &&
      ra_error_state_ptr() == nullptr) {
    return hipErrorInvalidValue;
  }
  for (int device = 0; device < kMaxDevices && err == hipSuccess; ++device) {
    if (g_cache[device] == nullptr) continue;
    err = hipSetDevice(device);
    if (err != hipSuccess) break;
    int32_t state[2] = {0, 0};
    err = hipMemcpy(state, g_cache[device], sizeof(state), hipMemcpyDeviceToHost);
    if (err == hipSuccess && reset) err = hipMemset(g_cache[device], 0, sizeof(state));
    out[0] += state[0];
    // [1] holds INT32_MAX - lowest bad segment: the largest is the lowest segment
    if (state[1] > out[1]) out[1] = state[1];
  }
  hipError_t restore = hipSetDevice(current);
  return err != hipSuccess ? err : restore;
}
