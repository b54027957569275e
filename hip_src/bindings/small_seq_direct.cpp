// small_seq_fwd_direct: the small-seq forward called from Python without the dispatcher (listed
// in module.cpp's method table).

#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "bindings/module.h"
#include "bindings/small_seq.h"
#include "small_seq/plan.h"

namespace {

// Argument i as a plain tensor (torch.Tensor or Parameter, not a subclass); false otherwise.
bool plain_tensor(PyObject* const* args, int i, at::Tensor& out) {
  if (!THPVariable_CheckExact(args[i])) return false;
  out = THPVariable_Unpack(args[i]);
  return true;
}

bool plain_optional_tensor(PyObject* const* args, int i, std::optional<at::Tensor>& out) {
  if (args[i] == Py_None) {
    out = std::nullopt;
    return true;
  }
  at::Tensor t;
  if (!plain_tensor(args, i, t)) return false;
  out = std::move(t);
  return true;
}

// The ints of a plan argument at most kMaxPlanInts long (a tuple or list of exact ints) into
// `buf`; false otherwise (the op's path then checks it).
constexpr int kMaxPlanInts = 2 + 2 * kSmallSeqPlanMaxLaunches * kSmallSeqLaunchInts;
bool plan_ints(PyObject* obj, int64_t (&buf)[kMaxPlanInts], at::IntArrayRef& out) {
  if (!PyTuple_CheckExact(obj) && !PyList_CheckExact(obj)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  if (n > kMaxPlanInts) return false;
  PyObject** items = PySequence_Fast_ITEMS(obj);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyLong_CheckExact(items[i])) return false;
    int overflow = 0;
    buf[i] = PyLong_AsLongLongAndOverflow(items[i], &overflow);
    if (overflow != 0) return false;
  }
  out = at::IntArrayRef(buf, static_cast<size_t>(n));
  return true;
}

}  // namespace

namespace rocm_attn::bindings {

// small_seq_fwd_direct(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
// softmax_scale, return_softmax, plan, backward_plan) -> (out, lse, probs) or None.
// The op's own C++ function without the dispatcher: for eager calls that need no autograd,
// where boxing the arguments against the schema cost about a third of the host time of a
// small call (rocm_attn/ops.py small_seq_forward). Same checks, stream and device guard as the
// op; a failed check raises as the op does (RuntimeError). None when an argument is not a plain
// tensor / int / float / bool / tuple or list of ints, e.g. a tensor subclass such as a fake
// tensor: the caller then takes the op, whose dispatch such subclasses rely on.
PyObject* small_seq_fwd_direct(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 11) {
    PyErr_SetString(PyExc_TypeError, "small_seq_fwd_direct takes 11 positional arguments");
    return nullptr;
  }
  at::Tensor q, k, v;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_kv, seqlens_kv;
  int64_t plan_buf[kMaxPlanInts], backward_plan_buf[kMaxPlanInts];
  at::IntArrayRef plan, backward_plan;
  if (!plain_tensor(args, 0, q) || !plain_tensor(args, 1, k) || !plain_tensor(args, 2, v) ||
      !plain_optional_tensor(args, 3, cu_seqlens_q) ||
      !plain_optional_tensor(args, 4, cu_seqlens_kv) ||
      !plain_optional_tensor(args, 5, seqlens_kv) || !PyLong_CheckExact(args[6]) ||
      !PyFloat_CheckExact(args[7]) || !PyBool_Check(args[8]) ||
      !plan_ints(args[9], plan_buf, plan) || !plan_ints(args[10], backward_plan_buf, backward_plan))
    Py_RETURN_NONE;
  int overflow = 0;
  const long long max_seqlen_kv = PyLong_AsLongLongAndOverflow(args[6], &overflow);
  if (overflow != 0) Py_RETURN_NONE;  // the op's path reports it
  auto [out, lse, probs] =
      small_seq_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                    PyFloat_AS_DOUBLE(args[7]), args[8] == Py_True, plan, backward_plan);
  PyObject* result = PyTuple_New(3);
  if (result == nullptr) return nullptr;
  PyTuple_SET_ITEM(result, 0, THPVariable_Wrap(std::move(out)));
  PyTuple_SET_ITEM(result, 1, THPVariable_Wrap(std::move(lse)));
  PyTuple_SET_ITEM(result, 2, THPVariable_Wrap(std::move(probs)));
  return result;
  END_HANDLE_TH_ERRORS
}

}  // namespace rocm_attn::bindings
