// The Python functions of the rocm_attn._C module (module.cpp's method table), defined next to
// what they serve: small_seq_direct.cpp, runtime.cpp.
#pragma once

#include <Python.h>

namespace rocm_attn::bindings {

// small_seq_fwd_direct(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
// softmax_scale, return_softmax, plan, backward_plan) -> (out, lse, probs) or None
// (METH_FASTCALL).
PyObject* small_seq_fwd_direct(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

// overlapped_launch() -> bool; warpgroup_mma() -> bool;
// tuning() -> {name: (value, environment variable)};
// set_tuning(name, value) -> previous value.
PyObject* overlapped_launch(PyObject* module, PyObject* unused);
PyObject* warpgroup_mma(PyObject* module, PyObject* unused);
PyObject* tuning(PyObject* module, PyObject* unused);
PyObject* set_tuning(PyObject* module, PyObject* args);

}  // namespace rocm_attn::bindings
