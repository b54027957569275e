// Per-device facts that launchers need at run time (declared in device_info.h).
#include "compat.h"
#include "tuning.h"

namespace {

// NOTE: read once per device; the values never change for a device. A benign race between
// threads writes the same value.
int cached_attribute(hipDeviceAttribute_t attribute, int (&cache)[64], int fallback) {
  int device = 0;
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= 64) return fallback;
  if (cache[device] == 0) {
    int value = 0;
    if (hipDeviceGetAttribute(&value, attribute, device) != hipSuccess || value <= 0) value = fallback;
    cache[device] = value;
  }
  return cache[device];
}

}  // namespace

int ra_device_wave_size() {
  static int cache[64] = {};
  return cached_attribute(hipDeviceAttributeWarpSize, cache, 32);
}

int ra_device_multiprocessors() {
  static int cache[64] = {};
  return cached_attribute(hipDeviceAttributeMultiprocessorCount, cache, 1);
}

int ra_device_index() {
  int device = 0;
  return hipGetDevice(&device) == hipSuccess ? device : 0;
}

int ra_device_max_shared_per_block() {
  static int cache[64] = {};
#if defined(__HIP__)
  return cached_attribute(hipDeviceAttributeMaxSharedMemoryPerBlock, cache, 48 * 1024);
#else
  // Read by its CUDA name: the opt-in limit has no HIP attribute of its own for hipify to map.
  return cached_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, cache, 48 * 1024);
#endif
}

int ra_device_shared_per_multiprocessor() {
  static int cache[64] = {};
  return cached_attribute(hipDeviceAttributeMaxSharedMemoryPerMultiprocessor, cache, 64 * 1024);
}

bool ra_device_overlapped_launch() {
#if defined(__HIP__)
  return false;
#else
  static int cache[64] = {};
  return ra_tuning().pdl != 0 && cached_attribute(hipDeviceAttributeComputeCapabilityMajor, cache, 1) >= 9;
#endif
}

bool ra_device_warpgroup_mma() {
#if defined(__HIP__) || !defined(RA_WGMMA_BUILD)
  return false;
#else
  static int major[64] = {};
  static int minor[64] = {};
  // cached_attribute treats 0 as "not read yet": store minor + 1.
  const int mj = cached_attribute(hipDeviceAttributeComputeCapabilityMajor, major, 1);
  int device = 0;
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= 64) return false;
  if (minor[device] == 0) {
    int value = 0;
    if (hipDeviceGetAttribute(&value, hipDeviceAttributeComputeCapabilityMinor, device) !=
        hipSuccess)
      value = -1;
    minor[device] = value + 1;
  }
  return mj == 9 && minor[device] == 1;
#endif
}
