// Launchers of the flash route's contract kernels (flash_contract_kernel.h): after torch's
// flash varlen forward / backward ran on the flash offsets, write what the tiled kernels'
// contract says flash did not (bad segments, overlaps, empty segments, padding rows).
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

#include "tiled_params.h"

// Forward: p as the tiled forward fills it for a THD call (offsets, totals, bounds, heads,
// o / lse and their strides, error_state); flash_cu_q / flash_cu_kv: the int32 [b + 1] offsets
// flash ran on. Returns hipSuccess or the launch error (hipErrorInvalidValue for a head dim
// that is not a multiple of 8 or a BSHD call).
hipError_t small_seq_flash_contract_fwd_launch(const SmallSeqTiledParams& p,
                                               const int32_t* flash_cu_q,
                                               const int32_t* flash_cu_kv,
                                               SmallSeqTiledDtype dtype, int head_dim,
                                               hipStream_t stream);
// Backward: p with the offsets, totals, bounds, heads and dq / dk / dv and their strides.
hipError_t small_seq_flash_contract_bwd_launch(const SmallSeqTiledParams& p,
                                               const int32_t* flash_cu_q,
                                               const int32_t* flash_cu_kv,
                                               SmallSeqTiledDtype dtype, int head_dim,
                                               hipStream_t stream);
// Flash offsets of both sides (flash_contract_kernel.h small_seq_flash_offsets_kernel): p's
// THD offsets, totals and batch; out: int32 [2, b + 1] (row 0 for q, row 1 for kv). Returns
// hipSuccess or the launch error (hipErrorInvalidValue without THD offsets on both sides).
hipError_t small_seq_flash_offsets_launch(const SmallSeqTiledParams& p, int32_t* out,
                                          hipStream_t stream);
