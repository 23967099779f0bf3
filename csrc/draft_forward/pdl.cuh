// Programmatic dependent launch (sm_90+): a kernel of the draft step is launched while the one before
// it drains, does the work that does not depend on it (weight and old KV loads), then waits.
//
// Every kernel launched this way calls pdl_wait() before it reads anything the kernel before it
// wrote and before it writes anything, then pdl_trigger() so that the next one may launch. Waiting
// means the previous grid has completed and its writes are visible; since that grid waited too
// before it triggered, every earlier launch on the stream has completed as well. Without the launch
// attribute (DRAFTER_LAB_PDL=0, or before sm_90) both are no-ops.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <utility>

namespace drafter_lab::draft_forward::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Whether launches carry the PDL attribute: sm_90+, unless DRAFTER_LAB_PDL=0 (for A/B timing and
// tools that predate PDL). Read once per process (inline: one static for every file that launches).
inline bool pdl_enabled() {
  static const bool on = [] {
    int dev = 0, major = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    const char* env = std::getenv("DRAFTER_LAB_PDL");
    return major >= 9 && !(env != nullptr && std::string(env) == "0");
  }();
  return on;
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  if (pdl_enabled()) {
    cfg.attrs = &pdl;
    cfg.numAttrs = 1;
  }
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace drafter_lab::draft_forward::cuda
