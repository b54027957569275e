// C entry points of the emulation library for tests/helpers/emu.py (ctypes): the project's own
// launchers (selftest, small-seq, THD) called with host buffers, plus the layout of the
// parameter structs so that the Python mirrors can be checked field by field.
#include <stddef.h>

#include <string>

#include "common/compat.h"
#include "common/error_state.h"
#include "common/selftest_kernel.h"
#include "common/tuning.h"
#include "small_seq/flash_contract.h"
#include "small_seq/params.h"
#include "small_seq/tiled_params.h"
#include "thd/params.h"

// The emulated device pass must be the one the kernels were compiled for (compat.h picks
// RA_WAVE_SIZE from the arch macros that hip_cpu_runtime.h sets).
#if !defined(RA_EMU_ALLOW_WAVE_MISMATCH)
static_assert(RA_WAVE_SIZE == RA_EMU_WAVE, "kernels compiled for another wave width than emulated");
#endif

extern "C" {

int emu_kernel_wave() { return RA_WAVE_SIZE; }
int emu_has_mma() { return RA_HAS_MMA; }

int emu_compat_selftest(const uint16_t* bf16_in, const uint16_t* fp16_in, const float* x,
                        float* out, uint16_t* vec_out) {
  return compat_selftest_launch(bf16_in, fp16_in, x, out, vec_out, nullptr);
}

int emu_mma_selftest(const uint16_t* x, const uint16_t* y, const uint16_t* v, int d, int kv,
                     int heads, int ny, int nv, int no, int fp16, float* s, int32_t* cover,
                     uint16_t* o, float* rowstat, int32_t* info) {
  return mma_selftest_launch(x, y, v, d, kv, heads, ny, nv, no, fp16 != 0, s, cover, o, rowstat,
                             info, nullptr);
}

// Sets one launch tuning value (common/tuning.h) of this library; returns the previous value,
// or INT32_MIN for an unknown name.
int emu_set_tuning(const char* name, int value) {
  int old = 0;
  return ra_set_tuning(name, value, &old) ? old : INT32_MIN;
}

int32_t* emu_error_state_ptr() { return ra_error_state_ptr(); }
int emu_error_state_read(int32_t* out, int reset) { return ra_error_state_read(out, reset != 0); }

#if defined(RA_EMU_SMALL_SEQ)
// plan: the ints of rocm_attn.small_seq_plan.one_query_ints (one direction's), as the op takes.
int emu_small_seq_fwd(const SmallSeqParams* p, int bf16, int head_dim, const int64_t* plan_ints,
                      int64_t plan_len, float* row_max) {
  SmallSeqPlan plan;
  if (!small_seq_plan_decode(plan_ints, plan_len, &plan)) return hipErrorInvalidValue;
  return small_seq_fwd_launch(*p, plan, bf16 ? SmallSeqDtype::kBFloat16 : SmallSeqDtype::kFloat16,
                              head_dim, nullptr, row_max);
}
int emu_small_seq_bwd(const SmallSeqParams* p, int bf16, int head_dim, const int64_t* plan_ints,
                      int64_t plan_len) {
  SmallSeqPlan plan;
  if (!small_seq_plan_decode(plan_ints, plan_len, &plan)) return hipErrorInvalidValue;
  return small_seq_bwd_launch(*p, plan, bf16 ? SmallSeqDtype::kBFloat16 : SmallSeqDtype::kFloat16,
                              head_dim, nullptr);
}
#endif

#if defined(RA_EMU_TILED)
// plan: the ints of rocm_attn.small_seq_plan.encode, as the op takes them.
int emu_small_seq_tiled_fwd(const SmallSeqTiledParams* p, int bf16, int head_dim,
                            const int64_t* plan_ints, int64_t plan_len) {
  SmallSeqPlan plan;
  if (!small_seq_plan_decode(plan_ints, plan_len, &plan)) return hipErrorInvalidValue;
  return small_seq_tiled_fwd_launch(
      *p, plan, bf16 ? SmallSeqTiledDtype::kBFloat16 : SmallSeqTiledDtype::kFloat16, head_dim,
      nullptr);
}
#endif

#if defined(RA_EMU_TILED)
int emu_small_seq_tiled_bwd(const SmallSeqTiledParams* p, int bf16, int head_dim,
                            const int64_t* plan_ints, int64_t plan_len) {
  SmallSeqPlan plan;
  if (!small_seq_plan_decode(plan_ints, plan_len, &plan)) return hipErrorInvalidValue;
  return small_seq_tiled_bwd_launch(
      *p, plan, bf16 ? SmallSeqTiledDtype::kBFloat16 : SmallSeqTiledDtype::kFloat16, head_dim,
      nullptr);
}
#endif

#if defined(RA_EMU_TILED)
int emu_small_seq_flash_contract_fwd(const SmallSeqTiledParams* p, const int32_t* flash_cu_q,
                                     const int32_t* flash_cu_kv, int bf16, int head_dim) {
  return small_seq_flash_contract_fwd_launch(
      *p, flash_cu_q, flash_cu_kv,
      bf16 ? SmallSeqTiledDtype::kBFloat16 : SmallSeqTiledDtype::kFloat16, head_dim, nullptr);
}
int emu_small_seq_flash_contract_bwd(const SmallSeqTiledParams* p, const int32_t* flash_cu_q,
                                     const int32_t* flash_cu_kv, int bf16, int head_dim) {
  return small_seq_flash_contract_bwd_launch(
      *p, flash_cu_q, flash_cu_kv,
      bf16 ? SmallSeqTiledDtype::kBFloat16 : SmallSeqTiledDtype::kFloat16, head_dim, nullptr);
}
int emu_small_seq_flash_offsets(const SmallSeqTiledParams* p, int32_t* out) {
  return small_seq_flash_offsets_launch(*p, out, nullptr);
}
#endif

#if defined(RA_EMU_THD)
int emu_thd_copy_rows(const ThdCopyParams* p) { return thd_copy_rows_launch(*p, nullptr); }
int emu_thd_merge(const ThdMergeParams* p) { return thd_merge_launch(*p, nullptr); }
int emu_thd_grad(const ThdGradParams* p) { return thd_grad_launch(*p, nullptr); }
#endif

// "name:offset;..." of every field the Python mirrors set, and the struct sizes.
const char* emu_layout() {
#define F(S, f) #S "." #f ":" + std::to_string(offsetof(S, f)) + ";"
  static const std::string s = [] {
    std::string r;
    r += "SmallSeqParams:" + std::to_string(sizeof(SmallSeqParams)) + ";";
    r += F(SmallSeqParams, q) F(SmallSeqParams, error_state) F(SmallSeqParams, q_token_stride)
        F(SmallSeqParams, dkv_batch_stride) F(SmallSeqParams, batch)
        F(SmallSeqParams, softmax_scale);
    r += "SmallSeqTiledParams:" + std::to_string(sizeof(SmallSeqTiledParams)) + ";";
    r += F(SmallSeqTiledParams, seqlens_kv_int64) F(SmallSeqTiledParams, error_state)
        F(SmallSeqTiledParams, q_batch_stride) F(SmallSeqTiledParams, dlse_head_stride)
        F(SmallSeqTiledParams, batch) F(SmallSeqTiledParams, s_kv)
        F(SmallSeqTiledParams, softmax_scale) F(SmallSeqTiledParams, workspace)
        F(SmallSeqTiledParams, workspace_elems);
    r += "ThdCopyParams:" + std::to_string(sizeof(ThdCopyParams)) + ";";
    r += F(ThdCopyParams, map) F(ThdCopyParams, rows) F(ThdCopyParams, heads)
        F(ThdCopyParams, fill_bytes);
    r += "ThdMergeParams:" + std::to_string(sizeof(ThdMergeParams)) + ";";
    r += F(ThdMergeParams, n) F(ThdMergeParams, map) F(ThdMergeParams, copy_first_half);
    r += "ThdGradParams:" + std::to_string(sizeof(ThdGradParams)) + ";";
    r += F(ThdGradParams, n) F(ThdGradParams, map) F(ThdGradParams, copy_none);
    r += "ThdRowMapParams:" + std::to_string(sizeof(ThdRowMapParams)) + ";";
    r += F(ThdRowMapParams, local_rows) F(ThdRowMapParams, step_count);
    return r;
  }();
#undef F
  return s.c_str();
}

}  // extern "C"
