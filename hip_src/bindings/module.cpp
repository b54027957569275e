// The rocm_attn._C extension module: the op namespace and the Python module.
//
// TORCH_LIBRARY(rocm_attn) is defined here and only here; every family's bindings file adds its
// schemas with TORCH_LIBRARY_FRAGMENT(rocm_attn, m) and its kernels with
// TORCH_LIBRARY_IMPL(rocm_attn, <key>, m) (small_seq*.cpp, thd_*.cpp, selftest.cpp,
// runtime.cpp). setup.py compiles every hip_src/bindings/*.cpp, so a new bindings file needs
// no other edit. The Python module holds the few entry points that are not ops (module.h).

#include <Python.h>

#include <torch/library.h>

#include "bindings/module.h"
#include "common/tuning.h"

TORCH_LIBRARY(rocm_attn, m) {}

namespace {

using namespace rocm_attn::bindings;

PyMethodDef module_methods[] = {
    {"tuning", &tuning, METH_NOARGS, "launch tuning values: {name: (value, environment variable)}"},
    {"set_tuning", &set_tuning, METH_VARARGS, "set_tuning(name, value) -> previous value"},
    {"overlapped_launch", &overlapped_launch, METH_NOARGS,
     "whether THD helper launches overlap the kernel before them (CUDA sm_90+, tuning pdl)"},
    {"warpgroup_mma", &warpgroup_mma, METH_NOARGS,
     "whether the current device runs the Hopper warpgroup-MMA kernels of this build"},
    {"small_seq_fwd_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                                 &small_seq_fwd_direct)),
     METH_FASTCALL, "small_seq_fwd without the dispatcher (eager calls without autograd)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// `import rocm_attn._C` loads this library, whose static initialisers register the ops of every
// bindings file; the Python module holds the entry points listed above.
extern "C" PyObject* PyInit__C() {
  ra_tuning();  // the environment's tuning values are read here, once (common/tuning.h)
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, module_methods};
  return PyModule_Create(&module);
}
