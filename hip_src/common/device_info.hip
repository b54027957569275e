// Per-device facts that launchers need at run time.
#include "compat.h"

int ra_device_wave_size() {
  // NOTE: read once per device; the value never changes for a device. A benign race between
  // threads writes the same value.
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {};
  int device = 0;
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= kMaxDevices) return 32;
  if (cache[device] == 0) {
    int width = 0;
    if (hipDeviceGetAttribute(&width, hipDeviceAttributeWarpSize, device) != hipSuccess || width <= 0)
      width = 32;
    cache[device] = width;
  }
  return cache[device];
}
