// Adds the submodule drafter_lab._C.allreduce (Communicator, CommError, segment helpers).
#pragma once

#include <pybind11/pybind11.h>

void register_allreduce(pybind11::module_& m);
