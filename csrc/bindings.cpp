// The Python module drafter_lab._C. Torch custom ops register through TORCH_LIBRARY in ops.cpp;
// objects that are not ops (the all-reduce communicator) bind here with pybind11.
#include <torch/extension.h>

#include "allreduce/register.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "drafter_lab compiled extension";
  register_allreduce(m);
}
