// The Python module drafter_lab._C. Torch custom ops register through TORCH_LIBRARY in ops.cpp;
// objects that are not ops (the all-reduce communicator) bind here with pybind11.
#include <torch/extension.h>

#include "allreduce/register.h"
#include "cpu_isa.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "drafter_lab compiled extension";
  register_allreduce(m);
  m.def("cpu_isa", [] { return drafter_lab::cpu_has_avx2() ? "avx2" : "portable"; },
        "The build of the CPU loops (draft step, all-reduce tiles) that this CPU runs: avx2 or portable.");
}
