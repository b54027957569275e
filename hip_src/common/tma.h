// rocm_attn: Hopper tensor memory accelerator (TMA) tile copies and shared-memory barriers, for
// kernels that stage operands with one instruction per tile instead of one 16-byte copy per
// thread and chunk.
//
// Two halves, each present only where it can exist:
// - Device (RA_HAS_WGMMA, i.e. sm_90a code): mbarrier init / arrive / wait, tensor tile loads
//   global -> shared completing on an mbarrier, tensor tile stores shared -> global in bulk
//   groups, and cp.async arrivals on an mbarrier.
// - Host (RA_TMA_BUILD: a CUDA build with sm_90a, setup.py's RA_WGMMA_BUILD, never hipcc): the
//   tensor map (CUtensorMap) of a [batch, tokens, heads, D] 16-bit tensor with boxes of
//   64 columns x box_heads x box_tokens x 1 in the 128-byte swizzle, which lands a box in
//   common/wgmma.h's operand layout (one 64-column panel, rows ordered token-major then head:
//   tools/diag/tma_layout_probe.cu checks both on a GPU).
//
// A tile copy writes its whole box: rows outside the tensor as zeros, rows inside the tensor but
// past the caller's segment as whatever is there. Kernels mask or zero such rows themselves.
#pragma once

#include "compat.h"
#include "wgmma.h"

#if defined(RA_WGMMA_BUILD) && !defined(__HIP__)
#define RA_TMA_BUILD 1
#include <cuda.h>
#else
#define RA_TMA_BUILD 0
#endif

#if RA_HAS_WGMMA

// Barrier at shared address `bar` expecting `count` arrivals per phase (one thread, before a
// block barrier; ra_mbar_init_fence() after the inits).
RA_DEVICE void ra_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
RA_DEVICE void ra_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One plain arrival (the phase completes with the barrier's count of them).
RA_DEVICE void ra_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival that also announces `bytes` of tile copies completing on this phase.
RA_DEVICE void ra_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One arrival when every cp.async this thread issued before it has landed (no arrival is
// counted now: the barrier's expected count includes this thread).
RA_DEVICE void ra_mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` of the barrier has completed.
RA_DEVICE void ra_mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "RA_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra RA_MBAR_WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Box (c0 column, c1 head, c2 token, c3 batch) of `map` into shared memory at `dst` (1024-byte
// aligned), its bytes completing on barrier `bar`.
RA_DEVICE void ra_tma_load(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2,
                           int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Shared memory at `src` to box (c0, c1, c2, c3) of `map` (the writes to `src` published first
// with ra_fence_proxy_async and a barrier); ra_tma_store_commit() closes a bulk group.
RA_DEVICE void ra_tma_store(const void* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
      ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}
RA_DEVICE void ra_tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's committed stores have read their shared memory (it may be rewritten).
RA_DEVICE void ra_tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Until they have completed (their global writes done), before the kernel exits.
RA_DEVICE void ra_tma_store_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

#endif  // RA_HAS_WGMMA

#if RA_TMA_BUILD

// Tensor map of a 16-bit [batch, tokens, heads, D] tensor at `base` (strides in elements, the
// head-dim stride 1) with boxes of 64 columns x box_heads heads x box_tokens tokens x 1 batch,
// 128-byte swizzle, zeros outside the tensor. False where TMA cannot describe it (an address
// or stride not a multiple of 16 bytes, an empty dimension) or the driver refuses: the caller
// keeps its cp.async kernel then.
bool ra_tma_map_16bit(CUtensorMap* map, const void* base, int64_t batch, int64_t tokens,
                      int64_t heads, int64_t d, int64_t batch_stride, int64_t token_stride,
                      int64_t head_stride, int box_heads, int box_tokens);

#endif  // RA_TMA_BUILD
