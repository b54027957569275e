// The small-seq ops' `plan` arguments (the records of hip_src/small_seq/plan.h, made by
// rocm_attn/small_seq_plan.py): their decoding and a launcher's refusal of one, raised as errors
// that name the op and the plan. Shared by the one-query ops (small_seq.cpp) and the tiled ones
// (small_seq_tiled.cpp, small_seq_tiled_bwd.cpp), so that their messages stay alike.
#pragma once

#include "bindings/torch_helpers.h"
#include "small_seq/plan.h"

namespace rocm_attn::bindings {

// The plan of `ints`, the op's argument `arg`; raises where they are not a plan, naming `op`,
// `arg` and `maker`, the rocm_attn.small_seq_plan function whose ints the argument takes.
inline SmallSeqPlan decode_plan(at::IntArrayRef ints, const char* op, const char* maker,
                                const char* arg = "plan") {
  SmallSeqPlan plan;
  TORCH_CHECK(small_seq_plan_decode(ints.data(), static_cast<int64_t>(ints.size()), &plan), op,
              ": ", arg, " must be the ints of rocm_attn.small_seq_plan.", maker, ", got ", ints);
  return plan;
}

// A launcher's result for a plan (`ints`): hipErrorNotSupported (a record names a kernel this
// build does not have) and hipErrorInvalidValue (a record does not fit the call or device) raise
// naming `op`, the plan and what may be missing (`no_kernel`) or misfit (`misfit`); any other
// error raises as a failed launch of `what`.
inline void check_plan_launch(hipError_t err, at::IntArrayRef ints, const char* op,
                              const char* no_kernel, const char* misfit, const char* what) {
  TORCH_CHECK(err != hipErrorNotSupported, op, ": this build has no kernel for the plan ", ints,
              " (", no_kernel, ")");
  TORCH_CHECK(err != hipErrorInvalidValue, op, ": the plan ", ints,
              " does not fit this call or device (", misfit, ")");
  check_launch(err, what);
}

}  // namespace rocm_attn::bindings
