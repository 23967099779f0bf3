// The torch face of the all-reduce: checks tensors, splits calls that exceed the staging buffer
// into chunks, picks LL, one-shot or two-shot per chunk, and runs the chosen backend. Bound with
// pybind11 (a communicator is an object, not an op); drafter_lab/kernels/allreduce.py wraps it.
#include <ATen/MemoryOverlap.h>
#include <torch/extension.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "allreduce/channel.h"
#include "allreduce/cpu_backend.h"
#include "allreduce/register.h"
#include "allreduce/segment.h"

#ifdef DRAFTER_LAB_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "allreduce/cuda_backend.h"
#endif

namespace drafter_lab {
namespace allreduce {
namespace {

constexpr bool kWithCuda =
#ifdef DRAFTER_LAB_WITH_CUDA
    true;
#else
    false;
#endif

uint32_t backend_code(const std::string& name) {
  if (name == "cpu") return kCpu;
  if (name == "cuda-host") return kCudaHost;
  if (name == "cuda-ipc") return kCudaIpc;
  throw std::invalid_argument("unknown all-reduce backend '" + name + "' (cpu, cuda-host, cuda-ipc)");
}

const char* backend_name(uint32_t code) {
  return code == kCpu ? "cpu" : code == kCudaHost ? "cuda-host" : "cuda-ipc";
}

uint32_t dtype_code(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default:
      throw std::invalid_argument(std::string(what) + " has dtype " + c10::toString(t.scalar_type()) +
                                  "; the all-reduce takes float32, bfloat16 or float16");
  }
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

class Communicator {
 public:
  Communicator(const std::string& name, int rank, int world_size, int64_t max_bytes, int blocks, double timeout_s,
               const std::string& backend, int device)
      : backend_(backend_code(backend)), device_(device) {
    if (world_size < 1 || world_size > kMaxRanks)
      throw std::invalid_argument("world_size must be in 1.." + std::to_string(kMaxRanks) + ", got " +
                                  std::to_string(world_size));
    if (rank < 0 || rank >= world_size)
      throw std::invalid_argument("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world_size - 1));
    if (max_bytes < 1) throw std::invalid_argument("max_bytes must be positive");
    if (blocks < 1 || blocks > kMaxBlocks)
      throw std::invalid_argument("blocks must be in 1.." + std::to_string(kMaxBlocks));
    if (!(timeout_s > 0)) throw std::invalid_argument("timeout_s must be positive");
    if (backend_ != kCpu && !kWithCuda)
      throw CommError("backend '" + backend + "' needs drafter_lab._C built with CUDA; this build has no CUDA");
    Segment seg;
    if (rank == 0) {
      cleanup_stale();
      seg = Segment::create(name, world_size, (uint64_t)max_bytes, (uint32_t)blocks, backend_);
    } else {
      seg = Segment::attach(name, world_size, rank, timeout_s);
      Header* h = seg.header();
      if (h->backend != backend_ || h->max_bytes != Layout::make((uint64_t)max_bytes, blocks, backend_ != kCpu).max_bytes ||
          h->blocks != (uint32_t)blocks) {
        const std::string message = "rank 0 created " + name + " with backend " + backend_name(h->backend) +
                                    ", max_bytes " + std::to_string(h->max_bytes) + ", blocks " +
                                    std::to_string(h->blocks) + "; rank " + std::to_string(rank) + " asked for " +
                                    backend + ", " + std::to_string(max_bytes) + ", " + std::to_string(blocks);
        // Rank 0 waits for us in its init barrier: tell it why, or it times out blaming a rank
        // "not attached". Not when a live process holds our seat (the segment is not ours to fail).
        const int32_t seat = __atomic_load_n(&h->pids[rank], __ATOMIC_ACQUIRE);
        if (seat == 0 || !pid_alive(seat)) record_abort(h, rank, message);
        throw CommError(message);
      }
    }
    ch_ = std::make_unique<Channel>(std::move(seg), rank, timeout_s);
#ifdef DRAFTER_LAB_WITH_CUDA
    if (backend_ != kCpu) cuda_ = std::make_unique<CudaBackend>(backend_, device_, *ch_);
#endif
    one_shot_max_bytes_ = (int64_t)ch_->layout().max_bytes;
    info_ = {rank, world_size, (int64_t)ch_->layout().max_bytes, (int64_t)capacity_bytes(),
             (int64_t)ll_capacity_bytes(), (int)ch_->layout().blocks, ch_->segment().name()};
  }

  ~Communicator() { close(); }

  void connect() {
    const auto lock = enter();
    channel().connect();
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) {
      cuda_->connect();
      ch_->barrier("cuda connect");
    }
#endif
  }

  void all_reduce(const at::Tensor& in, const at::Tensor& out, int64_t algo) {
    const auto lock = enter();
    Channel& ch = channel();
    check_tensor(in, "tensor");
    check_tensor(out, "out");
    check_pair(in, out, "out");
    Call c{};
    c.dtype = dtype_code(in, "tensor");
    c.numel_total = (uint64_t)in.numel();
    const size_t es = dtype_size(c.dtype);
    check_algo(algo, 3);
    const uint64_t cap = (algo == 3 ? ll_capacity_bytes() : capacity_bytes()) / es;
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    uint64_t off = 0;
    do {
      c.numel = std::min<uint64_t>(cap, c.numel_total - off);
      c.kind = sum_kind(c.numel * es, algo);
      c.in = src + off * es;
      c.out = dst + off * es;
      run(ch, c, aligned16(in) && aligned16(out));
      off += c.numel;
    } while (off < c.numel_total);
  }

  void fused(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& out,
             const at::Tensor& residual_out, double eps, int64_t algo) {
    const auto lock = enter();
    Channel& ch = channel();
    check_tensor(x, "x");
    check_tensor(residual, "residual");
    check_tensor(weight, "weight");
    check_tensor(out, "out");
    check_tensor(residual_out, "residual_out");
    if (x.dim() < 1 || x.size(-1) < 1) throw std::invalid_argument("x must have a last (hidden) dimension");
    const uint64_t H = (uint64_t)x.size(-1);
    if (weight.dim() != 1 || (uint64_t)weight.size(0) != H)
      throw std::invalid_argument("weight must have shape [" + std::to_string(H) + "], got " +
                                  c10::str(weight.sizes()));
    check_pair(x, residual, "residual");
    check_pair(x, out, "out");
    check_pair(x, residual_out, "residual_out");
    if (weight.scalar_type() != x.scalar_type()) throw std::invalid_argument("weight must have the dtype of x");
    // A row is read whole before its results are written, so an input may be its output, but an
    // output that starts elsewhere inside an input overwrites rows not read yet.
    check_overlap(residual, residual_out, "residual_out", "residual");
    check_overlap(residual, out, "out", "residual");
    for (const auto& [written, name] : {std::pair(&out, "out"), std::pair(&residual_out, "residual_out")}) {
      if (at::get_overlap_status(*written, weight) != at::MemOverlapStatus::No)
        throw std::invalid_argument(std::string(name) + " must not overlap weight");
    }
    if (at::get_overlap_status(out, residual_out) != at::MemOverlapStatus::No)
      throw std::invalid_argument("out and residual_out must not overlap");
    Call c{};
    c.dtype = dtype_code(x, "x");
    c.numel_total = (uint64_t)x.numel();
    c.hidden = H;
    c.eps = (float)eps;
    c.weight = weight.data_ptr();
    const size_t es = dtype_size(c.dtype);
    const uint64_t cap_rows = capacity_rows(H, es);
    if (cap_rows == 0)
      throw std::invalid_argument("a row of " + std::to_string(H) + " elements does not fit the staging buffer (max_bytes " +
                                  std::to_string(ch.layout().max_bytes) + ", blocks " +
                                  std::to_string(ch.layout().blocks) + "); raise max_bytes");
    check_algo(algo, 2);
    const bool aligned = aligned16(x) && aligned16(residual) && aligned16(weight) && aligned16(out) &&
                         aligned16(residual_out) && (H * es) % 16 == 0;
    const uint64_t rows = c.numel_total / H;
    uint64_t row = 0;
    do {
      const uint64_t n = std::min(cap_rows, rows - row);
      const uint64_t off = row * H * es;
      c.numel = n * H;
      c.kind = fused_kind(n, H, es, algo);
      c.in = static_cast<const char*>(x.data_ptr()) + off;
      c.residual = static_cast<const char*>(residual.data_ptr()) + off;
      c.out = static_cast<char*>(out.data_ptr()) + off;
      c.residual_out = static_cast<char*>(residual_out.data_ptr()) + off;
      run(ch, c, aligned);
      row += n;
    } while (row < rows);
  }

  void barrier() {
    const auto lock = enter();
    channel().barrier("user");
  }

  // The next call is generation `gen` + 1 (tests of wrap-around); every rank sets the same.
  void set_generation(int64_t gen) {
    const auto lock = enter();
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) {
      cuda_->set_generation((uint32_t)gen);
      return;
    }
#endif
    channel().set_generation((uint32_t)gen);
  }

  // Waits for a call in flight on another thread (at most its timeout): unmapping under it crashed.
  // A child forked after init takes no lock: its copy of mu_ may be locked by a thread it lacks.
  void close() {
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (getpid() == pid_) lock.lock();
    closed_ = true;
#ifdef DRAFTER_LAB_WITH_CUDA
    cuda_.reset();
#endif
    ch_.reset();
  }

  // Under mu_ like a call: a close on another thread frees what it reads. A CUDA call holds mu_
  // only while it enqueues, so this waits for no kernel.
  std::string error() {
    const auto lock = enter();
    if (closed_) throw CommError("this communicator is closed");
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) return cuda_->error();
#endif
    return "";
  }

  int rank() const { return info().rank; }
  int world_size() const { return info().world; }
  int64_t max_bytes() const { return info().max_bytes; }
  int64_t capacity() const { return info().capacity; }
  int blocks() const { return info().blocks; }
  std::string backend() const { return backend_name(backend_); }
  std::string name() const { return info().name; }
  bool closed() const { return closed_; }
  int64_t one_shot_max_bytes() const { return one_shot_max_bytes_; }
  void set_one_shot_max_bytes(int64_t v) {
    if (v < 0) throw std::invalid_argument("one_shot_max_bytes must be >= 0");
    one_shot_max_bytes_ = v;
  }
  int64_t ll_capacity() const { return info().ll_capacity; }
  int64_t ll_max_bytes() const { return ll_max_bytes_; }
  void set_ll_max_bytes(int64_t v) {
    if (v < 0) throw std::invalid_argument("ll_max_bytes must be >= 0");
    if (v > 0 && backend_ == kCpu)
      throw std::invalid_argument("the LL protocol runs on the CUDA backends; the cpu backend takes ll_max_bytes=0");
    ll_max_bytes_ = v;
  }

 private:
  // What the properties report, fixed at init: they run holding the GIL, so they neither wait for
  // mu_ (a call holds it up to its timeout) nor read ch_, which a close on another thread resets.
  struct Info {
    int rank, world;
    int64_t max_bytes, capacity, ll_capacity;
    int blocks;
    std::string name;
  };
  const Info& info() const {
    if (closed_) throw CommError("this communicator is closed");
    return info_;
  }

  // Every call's entry: refuses a process forked after init (it would post the rank's flags as
  // its own, and its copy of mu_ may be locked), then takes mu_.
  std::unique_lock<std::mutex> enter() {
    if (getpid() != pid_)
      throw CommError("rank " + std::to_string(info_.rank) + "'s communicator belongs to pid " + std::to_string(pid_) +
                      "; this process (pid " + std::to_string(getpid()) +
                      ") was forked from it and cannot use it: create a new communicator here");
    return std::unique_lock<std::mutex>(mu_);
  }

  Channel& channel() const {
    if (!ch_) throw CommError("this communicator is closed");
    return *ch_;
  }

  uint64_t capacity_bytes() const {
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) return cuda_->capacity_bytes();
#endif
    return channel().layout().max_bytes;
  }

  uint64_t ll_capacity_bytes() const {
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) return cuda_->ll_capacity_bytes();
#endif
    return 0;
  }

  uint64_t ll_capacity_rows(uint64_t hidden, size_t es) const {
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) return cuda_->ll_capacity_rows(hidden, es);
#endif
    (void)hidden, (void)es;
    return 0;
  }

  uint64_t capacity_rows(uint64_t hidden, size_t es) const {
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) return cuda_->capacity_rows(hidden, es);
#endif
    return channel().layout().max_bytes / (hidden * es);
  }

  // algo: 0 = by size against the thresholds, 1 = one-shot, 2 = two-shot, 3 = LL (sums on CUDA;
  // fused calls take LL only by the threshold).
  void check_algo(int64_t algo, int64_t last) const {
    if (algo < 0 || algo > last)
      throw std::invalid_argument(last == 3 ? "algo must be 0 (auto), 1 (one-shot), 2 (two-shot) or 3 (LL)"
                                            : "algo must be 0 (auto), 1 (one-shot) or 2 (two-shot)");
    if (algo == 3 && backend_ == kCpu) throw std::invalid_argument("the LL protocol (algo 3) runs on the CUDA backends");
  }

  bool one_shot(uint64_t bytes, int64_t algo) const {
    return algo == 0 ? (int64_t)bytes <= one_shot_max_bytes_ : algo == 1;
  }

  uint32_t fused_kind(uint64_t rows, uint64_t hidden, size_t es, int64_t algo) const {
    const uint64_t bytes = rows * hidden * es;
    if (algo == 0 && (int64_t)bytes <= ll_max_bytes_ && rows <= ll_capacity_rows(hidden, es)) return kFusedLL;
    return one_shot(bytes, algo) ? kFusedOneShot : kFusedTwoShot;
  }

  uint32_t sum_kind(uint64_t bytes, int64_t algo) const {
    if (algo == 3 || (algo == 0 && (int64_t)bytes <= ll_max_bytes_ && bytes <= ll_capacity_bytes())) return kSumLL;
    return one_shot(bytes, algo) ? kSumOneShot : kSumTwoShot;
  }

  void check_tensor(const at::Tensor& t, const char* what) const {
    // Before is_contiguous, which a sparse tensor answers by refusing to have strides at all.
    if (t.layout() != at::kStrided)
      throw std::invalid_argument(std::string(what) + " is a " + c10::str(t.layout()) +
                                  " tensor; the all-reduce sums dense (strided) tensors");
    if (!t.is_contiguous()) throw std::invalid_argument(std::string(what) + " must be contiguous");
    if (backend_ == kCpu) {
      if (!t.device().is_cpu())
        throw std::invalid_argument(std::string(what) + " is on " + t.device().str() + "; the cpu backend takes CPU tensors");
    } else if (!t.device().is_cuda() || t.device().index() != device_) {
      throw std::invalid_argument(std::string(what) + " is on " + t.device().str() + "; this communicator uses cuda:" +
                                  std::to_string(device_));
    }
  }

  static void check_pair(const at::Tensor& a, const at::Tensor& b, const char* what) {
    // The shape, not only the element count: an `out` of [2, 4] for an input of [8] would be filled
    // and returned in a shape the caller did not ask for.
    if (b.scalar_type() != a.scalar_type() || b.sizes() != a.sizes())
      throw std::invalid_argument(std::string(what) + " must match the input's dtype and shape");
    check_overlap(a, b, what, "the input");
  }

  // `b` may be `a` itself (in place) or apart from it, not part of it.
  static void check_overlap(const at::Tensor& a, const at::Tensor& b, const char* what, const char* of) {
    if (b.data_ptr() != a.data_ptr() && at::get_overlap_status(a, b) != at::MemOverlapStatus::No)
      throw std::invalid_argument(std::string(what) + " partially overlaps " + of);
  }

  void run(Channel& ch, const Call& c, bool aligned) {
#ifdef DRAFTER_LAB_WITH_CUDA
    if (cuda_) {
      ch.check_usable();
      std::string err = cuda_->error();
      if (!err.empty()) ch.fail(err);
      c10::cuda::CUDAGuard guard(device_);
      cuda_->launch(c, aligned, c10::cuda::getCurrentCUDAStream(device_).stream());
      return;
    }
#endif
    (void)aligned;
    cpu_run(ch, c);
  }

  uint32_t backend_;
  int device_;
  // Thresholds: set with the GIL held while another thread's call may read them.
  std::atomic<int64_t> one_shot_max_bytes_{0};
  std::atomic<int64_t> ll_max_bytes_{0};
  // Held by every call and by close: calls run without the GIL, and two at once on one
  // communicator shared its generation counter and buffers.
  std::mutex mu_;
  std::atomic<bool> closed_{false};
  const pid_t pid_ = getpid();
  Info info_;
  std::unique_ptr<Channel> ch_;
#ifdef DRAFTER_LAB_WITH_CUDA
  std::unique_ptr<CudaBackend> cuda_;
#endif
};

}  // namespace allreduce
}  // namespace drafter_lab

void register_allreduce(pybind11::module_& m) {
  namespace py = pybind11;
  using drafter_lab::allreduce::Communicator;
  using release = py::call_guard<py::gil_scoped_release>;
  auto sub = m.def_submodule("allreduce", "Shared-memory all-reduce (see drafter_lab.kernels.allreduce)");
  py::register_exception<drafter_lab::allreduce::CommError>(sub, "CommError", PyExc_RuntimeError);
  py::class_<Communicator>(sub, "Communicator")
      .def(py::init<const std::string&, int, int, int64_t, int, double, const std::string&, int>(), py::arg("name"),
           py::arg("rank"), py::arg("world_size"), py::arg("max_bytes"), py::arg("blocks"), py::arg("timeout_s"),
           py::arg("backend"), py::arg("device"), release())
      .def("connect", &Communicator::connect, release())
      .def("all_reduce", &Communicator::all_reduce, py::arg("tensor"), py::arg("out"), py::arg("algo") = 0, release())
      .def("fused", &Communicator::fused, py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("out"),
           py::arg("residual_out"), py::arg("eps"), py::arg("algo") = 0, release())
      .def("barrier", &Communicator::barrier, release())
      .def("_set_generation", &Communicator::set_generation, py::arg("gen"), release())
      .def("close", &Communicator::close, release())
      .def("error", &Communicator::error, release())
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("world_size", &Communicator::world_size)
      .def_property_readonly("max_bytes", &Communicator::max_bytes)
      .def_property_readonly("capacity", &Communicator::capacity)
      .def_property_readonly("blocks", &Communicator::blocks)
      .def_property_readonly("backend", &Communicator::backend)
      .def_property_readonly("name", &Communicator::name)
      .def_property_readonly("closed", &Communicator::closed)
      .def_property("one_shot_max_bytes", &Communicator::one_shot_max_bytes, &Communicator::set_one_shot_max_bytes)
      .def_property_readonly("ll_capacity", &Communicator::ll_capacity)
      .def_property("ll_max_bytes", &Communicator::ll_max_bytes, &Communicator::set_ll_max_bytes);
  sub.def("segment_name", &drafter_lab::allreduce::segment_name, py::arg("tag"));
  sub.def("unique_segment_name", &drafter_lab::allreduce::unique_segment_name);
  sub.def("cleanup_stale", &drafter_lab::allreduce::cleanup_stale, py::arg("min_age_s") = 30.0,
          "Removes all-reduce segments whose processes are all dead; returns their names.");
  sub.attr("with_cuda") = drafter_lab::allreduce::kWithCuda;
  sub.attr("max_ranks") = drafter_lab::allreduce::kMaxRanks;
  sub.attr("max_blocks") = drafter_lab::allreduce::kMaxBlocks;
}
