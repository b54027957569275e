// The extension's run-time state as seen from Python: the device error counter (op
// rocm_attn::read_error_state), the launch tuning values (common/tuning.h), whether THD
// launches overlap and whether the warpgroup-MMA kernels run (common/device_info.h). The Python
// functions here are listed in module.cpp.

#include <Python.h>

#include <vector>

#include "bindings/module.h"
#include "bindings/torch_helpers.h"
#include "common/device_info.h"
#include "common/error_state.h"
#include "common/tuning.h"

namespace {

using rocm_attn::bindings::check_launch;

// Reads (and optionally clears) the error counters of every device a kernel has counted on,
// merged: [count, first bad segment or -1]. Synchronises those devices; never called on a
// default path.
std::vector<int64_t> read_error_state(bool reset) {
  int32_t state[2] = {0, 0};
  check_launch(ra_error_state_read(state, reset), "reading the device error counter");
  return {state[0], state[1] == 0 ? -1 : static_cast<int64_t>(0x7fffffff) - state[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def("read_error_state(bool reset) -> int[]", &read_error_state);
}

namespace rocm_attn::bindings {

// overlapped_launch() -> bool: whether kernels launched through ra_launch (the THD helpers) may
// start while the kernel before them drains, on the current device (benchmark reports).
PyObject* overlapped_launch(PyObject* /*module*/, PyObject* /*unused*/) {
  if (ra_device_overlapped_launch()) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// warpgroup_mma() -> bool: whether the current device runs the Hopper warpgroup-MMA kernels of
// this build (the tiled forward's fastest kernel; the flash-route rule asks).
PyObject* warpgroup_mma(PyObject* /*module*/, PyObject* /*unused*/) {
  if (ra_device_warpgroup_mma()) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// tuning() -> {name: (value, environment variable)}: the launch tuning values (common/tuning.h).
PyObject* tuning(PyObject* /*module*/, PyObject* /*unused*/) {
  const RaTuning& t = ra_tuning();
  PyObject* result = PyDict_New();
  if (result == nullptr) return nullptr;
  for (const RaTuningKnob& knob : kRaTuningKnobs) {
    PyObject* entry = Py_BuildValue("(is)", t.*knob.field, knob.env);
    if (entry == nullptr || PyDict_SetItemString(result, knob.name, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(result);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return result;
}

// set_tuning(name, value) -> previous value; KeyError for an unknown name.
PyObject* set_tuning(PyObject* /*module*/, PyObject* args) {
  const char* name = nullptr;
  int value = 0;
  if (!PyArg_ParseTuple(args, "si", &name, &value)) return nullptr;
  int old = 0;
  if (!ra_set_tuning(name, value, &old)) {
    PyErr_Format(PyExc_KeyError, "unknown tuning name %s", name);
    return nullptr;
  }
  return PyLong_FromLong(old);
}

}  // namespace rocm_attn::bindings
