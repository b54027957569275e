// Per-device facts that launchers need at run time (device_info.hip). Plain host declarations,
// so that the bindings (hip_src/bindings), compiled without the GPU compiler, can include them.
#pragma once

// Wave width and multiprocessor (CU/SM) count of the current device, read once per device.
int ra_device_wave_size();
int ra_device_multiprocessors();
int ra_device_index();
// Largest dynamic shared memory one block of the current device may use, in bytes (on NVIDIA
// the opt-in limit: a kernel launched with more than 48 KiB first raises its own limit,
// ra_allow_dynamic_shared) and the shared memory of one multiprocessor.
int ra_device_max_shared_per_block();
int ra_device_shared_per_multiprocessor();
// Whether launches on the current device may overlap the kernel before them (programmatic
// dependent launch: CUDA, compute capability >= 9.0, and the tuning value pdl not 0).
bool ra_device_overlapped_launch();
// Whether the current device runs the Hopper warpgroup-MMA kernels of this build: CUDA, compute
// capability 9.0 exactly (the sm_90a code runs nowhere else), and the extension compiled for
// sm_90a (setup.py defines RA_WGMMA_BUILD then; the kernels are empty in an sm_90-only build).
bool ra_device_warpgroup_mma();
