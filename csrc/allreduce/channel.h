// Host side of the protocol: one rank's view of the segment, its generation counter, the
// spin-then-yield waits with timeout/abort/dead-peer detection, and the host barrier.
#pragma once

#include <cstdint>
#include <string>

#include "allreduce/layout.h"
#include "allreduce/segment.h"

namespace drafter_lab {
namespace allreduce {

// One call (or one chunk of a call larger than the staging buffer).
struct Call {
  uint32_t kind;
  uint32_t dtype;
  uint64_t numel_total;  // whole call, for the signature: chunks of mismatched calls fail at once
  uint64_t hidden;       // row width of the fused variant, 0 for a plain sum
  const void* in;
  void* out;
  uint64_t numel;  // this chunk
  const void* residual;
  void* residual_out;
  const void* weight;
  float eps;

  uint32_t sig() const { return signature(numel_total, dtype, kind, hidden); }
  std::string describe() const;
};

const char* dtype_name(uint32_t dtype);
const char* kind_name(uint32_t kind);

class Channel {
 public:
  Channel(Segment segment, int rank, double timeout_s);
  ~Channel();

  int rank() const { return rank_; }
  int world() const { return world_; }
  Header* header() const { return seg_.header(); }
  char* slots() const { return seg_.slots(); }
  Layout layout() const { return layout_; }
  Segment& segment() { return seg_; }
  double timeout_s() const { return timeout_s_; }
  // For the device's waits, saturated: a cast out of uint64's range is undefined, and inf (no timeout)
  // came out 0 on x86, a timeout at the first poll.
  uint64_t timeout_ns() const {
    return timeout_s_ * 1e9 >= 18446744073709551616.0 ? UINT64_MAX : static_cast<uint64_t>(timeout_s_ * 1e9);
  }
  uint32_t next_generation() { return ++gen_; }
  // The next call is generation `gen` + 1 (tests of wrap-around; every rank sets the same).
  void set_generation(uint32_t gen) { gen_ = gen; }
  // Stamps every flag line of this rank in `gen`'s buffer with gen - 2 (see refresh_due).
  void refresh_lines(uint32_t gen);

  // Every rank arrives; raises (naming the rank it still waits for) after the timeout.
  void barrier(const char* what);
  // The init barrier; afterwards rank 0 unlinks the segment's name (all ranks have it mapped).
  void connect();
  // Throws if this channel already failed (its peers may be out of step).
  void check_usable() const;
  // Records the failure for the peers (they raise at once instead of timing out) and throws.
  [[noreturn]] void fail(const std::string& message);

  // Releases `gen` on flag `f`, waking peers that sleep on it.
  void publish(FlagLine* f, uint32_t gen, uint32_t sig) {
    __atomic_store_n(&f->word, flag_word(gen, sig), __ATOMIC_RELEASE);
    notify(reinterpret_cast<uint32_t*>(&f->word));
  }
  void write_header(uint32_t gen, const Call& c);
  // Waits until `peer` posted `gen` on `f` (acquire), then checks the call signature.
  void wait_flag(const FlagLine* f, uint32_t gen, int peer, const Call& c) {
    uint64_t w = __atomic_load_n(&f->word, __ATOMIC_ACQUIRE);
    if ((uint32_t)w != gen) w = wait_slow(f, gen, peer, c);
    if ((uint32_t)(w >> 32) != c.sig()) mismatch(peer, gen, c);
  }

  void leave();  // the communicator is closing: drop our pid, unmap

 private:
  uint64_t wait_slow(const FlagLine* f, uint32_t gen, int peer, const Call& c);
  [[noreturn]] void mismatch(int peer, uint32_t gen, const Call& c);
  // Raises that a peer gave up, for a barrier `what` whose waits passed without looking at the abort
  // word. (Calls do not check it after their waits: the word does not say which call a peer gave up
  // on, and a peer already failing the next call would fail this one, which completed. A rank late
  // for a call its peer gave up on learns of it at its next call.)
  [[noreturn]] void peer_gave_up(const std::string& what);
  // Spins, then yields, then sleeps on the futex `word` (a 32-bit word of `peer` that changes
  // when `ready()` may have become true) until ready() holds; raises when a peer aborted, died
  // or left, or after the timeout. `what()` describes the wait for error messages.
  template <class Ready, class What>
  void wait_until(Ready ready, const uint32_t* word, int peer, What what);
  template <class What>
  void check_waiting(double now, double started, double& next_liveness, int peer, What what);
  void notify(uint32_t* word) {
    // Dekker pairing with wait_until: either we see its sleeper count or it sees our store.
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&header()->control[rank_].sleepers, __ATOMIC_RELAXED) != 0) wake(word);
  }
  void wake(uint32_t* word);

  Segment seg_;
  Layout layout_;
  int rank_;
  int world_;
  double timeout_s_;
  double spin_s_, max_spin_s_;  // how long a wait spins (then yields 3x as long) before it sleeps
  bool woke_peer_ = false;       // we woke a sleeping peer since the last wait
  bool crowded_ = false;         // more ranks than usable cores
  uint32_t gen_ = 0;
  uint32_t barrier_gen_ = 0;
  bool connected_ = false;
  std::string broken_;
};

}  // namespace allreduce
}  // namespace drafter_lab
