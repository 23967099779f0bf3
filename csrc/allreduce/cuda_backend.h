// CUDA backends (built only with CUDA). Both run the slot/flag protocol of layout.h inside one
// kernel per call, with per-block generation counters kept on the device, so calls can be
// captured in a CUDA graph and replayed; no host work per call besides the launch.
//  - host-staged: the shared segment is registered as mapped pinned memory; each rank writes its
//    contribution to its own slot over PCIe and reads the peers' slots (works without P2P).
//  - IPC: each rank owns a device buffer with one slot per peer (cudaIpcGetMemHandle); a rank
//    pushes its contribution and flags into every peer's buffer and polls only its own memory.
// Both also run LL (kSumLL, kFusedLL): packets that carry their own readiness, no flag to wait on.
// Kernels time out after the communicator's timeout, record why in mapped host memory and exit;
// `error()` reads it without a device sync.
#pragma once

#include <memory>
#include <string>

#include "allreduce/channel.h"

namespace drafter_lab {
namespace allreduce {

class CudaBackend {
 public:
  // host-staged: registers the segment; IPC: allocates the device slots and publishes its handle
  // in the segment header. Call connect() after the init barrier.
  CudaBackend(uint32_t backend, int device, Channel& ch);
  ~CudaBackend();
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  void connect();  // IPC: opens the peers' buffers
  // Bytes one launch can carry: blocks * per-block stride.
  uint64_t capacity_bytes() const;
  // Bytes one LL launch can carry (its packets take twice the bytes they carry): every CTA's
  // share, split as the kernel splits it, fits its stride of the LL area.
  uint64_t ll_capacity_bytes() const;
  // Rows of `hidden` elements one fused launch can carry (0 when a row exceeds a block's stride).
  uint64_t capacity_rows(uint64_t hidden, size_t elem_size) const;
  // The same for the LL fused kind (a row's packets take twice its bytes, rounded up to packets).
  uint64_t ll_capacity_rows(uint64_t hidden, size_t elem_size) const;
  // Enqueues `c` on `stream` (a cudaStream_t). `aligned`: every pointer of `c` is 16-byte aligned.
  void launch(const Call& c, bool aligned, void* stream);
  // Sets every CTA's generation counter to `gen` (tests of wrap-around), once queued calls are done.
  void set_generation(uint32_t gen);
  // "" while fine, else the first failure a kernel of this rank reported.
  std::string error() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace allreduce
}  // namespace drafter_lab
