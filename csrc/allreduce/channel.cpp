#include "allreduce/channel.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace drafter_lab {
namespace allreduce {
namespace {

// A wait spins (a peer on another core answers faster than a context switch), then yields for a
// while, then sleeps on a futex in short slices. The spin adapts between kMinSpinSeconds and
// kSpinSeconds; with more ranks than cores it stays short (spinning only delays ranks without a core).
constexpr double kSpinSeconds = 30e-6;
constexpr double kMinSpinSeconds = 1e-6;
constexpr double kCrowdedSpinSeconds = 2e-6;
constexpr double kYieldFactor = 4;
constexpr long kSleepSliceNs = 2000000;

int usable_cpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
}
constexpr double kLivenessPeriod = 0.05;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

std::string seconds(double s) {
  char t[32];
  std::snprintf(t, sizeof(t), "%.3g s", s);
  return t;
}

}  // namespace

const char* dtype_name(uint32_t dtype) {
  switch (dtype) {
    case kF32: return "float32";
    case kBF16: return "bfloat16";
    case kF16: return "float16";
  }
  return "unknown dtype";
}

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case kSumOneShot: return "one-shot sum";
    case kSumTwoShot: return "two-shot sum";
    case kFusedOneShot: return "one-shot sum+residual+rmsnorm";
    case kFusedTwoShot: return "two-shot sum+residual+rmsnorm";
    case kSumLL: return "LL sum";
    case kFusedLL: return "LL sum+residual+rmsnorm";
  }
  return "unknown kind";
}

std::string Call::describe() const {
  std::string s = std::string(kind_name(kind)) + " of " + std::to_string(numel_total) + " " + dtype_name(dtype);
  if (hidden) s += " (rows of " + std::to_string(hidden) + ")";
  return s;
}

Channel::Channel(Segment segment, int rank, double timeout_s)
    : seg_(std::move(segment)), rank_(rank), timeout_s_(timeout_s) {
  Header* h = seg_.header();
  world_ = (int)h->world_size;
  layout_ = seg_.layout();
  crowded_ = world_ > usable_cpus();
  max_spin_s_ = crowded_ ? kCrowdedSpinSeconds : kSpinSeconds;
  spin_s_ = max_spin_s_;
  const int32_t me = (int32_t)getpid();
  int32_t prev = 0;
  if (!__atomic_compare_exchange_n(&h->pids[rank], &prev, me, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    if (pid_alive(prev))
      throw CommError("rank " + std::to_string(rank) + " of segment " + seg_.name() + " is already taken by pid " +
                      std::to_string(prev) + " (two processes with the same rank?)");
    __atomic_store_n(&h->pids[rank], me, __ATOMIC_RELEASE);
  }
  __atomic_fetch_add(&h->attached, 1u, __ATOMIC_ACQ_REL);
}

Channel::~Channel() { leave(); }

void Channel::leave() {
  Header* h = seg_.header();
  if (!h) return;
  // Only the process that took the seat gives it up: a forked child holds a copy of this channel
  // (and the mapping) but not the seat, and clearing it told the peers that the rank had closed.
  int32_t me = (int32_t)getpid();
  if (__atomic_compare_exchange_n(&h->pids[rank_], &me, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    // After a completed init rank 0 already unlinked the name (it may name someone else's segment
    // by now); before that, the last rank out removes it.
    if (__atomic_fetch_sub(&h->attached, 1u, __ATOMIC_ACQ_REL) == 1 && !connected_) seg_.unlink();
  }
  seg_.unmap();
}

void Channel::connect() {
  barrier("init");  // raises when a peer already gave up on it (it may have left: the group is gone)
  connected_ = true;
  if (rank_ == 0) seg_.unlink();  // every rank has it mapped: a killed run now leaks nothing
}

void Channel::check_usable() const {
  if (!broken_.empty()) throw CommError("this communicator failed earlier and cannot be used again: " + broken_);
  if (!seg_.header()) throw CommError("this communicator is closed");
}

void Channel::fail(const std::string& message) {
  broken_ = message;
  record_abort(seg_.header(), rank_, message);
  throw CommError(message);
}

void Channel::peer_gave_up(const std::string& what) {
  Header* h = seg_.header();
  // -1: the peer is between claiming the abort and naming itself (a few stores), unless it died there.
  const double deadline = now_s() + timeout_s_;
  int32_t aborted;
  while ((aborted = __atomic_load_n(&h->abort_rank, __ATOMIC_ACQUIRE)) < 0 && now_s() < deadline) sched_yield();
  broken_ = aborted > 0 ? "rank " + std::to_string(aborted - 1) + " gave up: " + h->abort_msg : "a rank gave up";
  throw CommError(broken_ + " (rank " + std::to_string(rank_) + " arrived after it, at " + what + ")");
}

void Channel::refresh_lines(uint32_t gen) {
  for (int phase = 0; phase < 2; ++phase)
    for (uint32_t b = 0; b < layout_.blocks; ++b)
      __atomic_store_n(&layout_.flag(slots(), rank_, gen, phase, (int)b)->word, flag_word(gen - 2, 0), __ATOMIC_RELEASE);
}

void Channel::write_header(uint32_t gen, const Call& c) {
  FlagLine* f = layout_.flag(slots(), rank_, gen, 0, 0);
  f->numel = c.numel_total;
  f->dtype = c.dtype;
  f->kind = c.kind;
  f->hidden = c.hidden;
}

void Channel::mismatch(int peer, uint32_t gen, const Call& c) {
  const FlagLine* f = layout_.flag(slots(), peer, gen, 0, 0);
  Call theirs = c;
  theirs.numel_total = f->numel;
  theirs.dtype = f->dtype;
  theirs.kind = f->kind;
  theirs.hidden = f->hidden;
  fail("all-reduce call mismatch in call #" + std::to_string(gen) + ": rank " + std::to_string(peer) + " sent a " +
       theirs.describe() + ", rank " + std::to_string(rank_) + " a " + c.describe());
}

template <class What>
void Channel::check_waiting(double now, double started, double& next_liveness, int peer, What what) {
  Header* h = seg_.header();
  const int32_t aborted = __atomic_load_n(&h->abort_rank, __ATOMIC_ACQUIRE);
  if (aborted > 0 && aborted != rank_ + 1) {
    broken_ = "rank " + std::to_string(aborted - 1) + " gave up: " + h->abort_msg;
    throw CommError(broken_ + " (rank " + std::to_string(rank_) + " was waiting for " + what() + ")");
  }
  const int32_t pid = __atomic_load_n(&h->pids[peer], __ATOMIC_ACQUIRE);
  if (now >= next_liveness) {
    next_liveness = now + kLivenessPeriod;
    if (connected_ && pid == 0)
      fail("rank " + std::to_string(peer) + " closed its communicator while rank " + std::to_string(rank_) +
           " waited for " + what());
    if (pid != 0 && !pid_alive(pid))
      fail("rank " + std::to_string(peer) + " (pid " + std::to_string(pid) + ") exited while rank " +
           std::to_string(rank_) + " waited for " + what());
  }
  if (now - started > timeout_s_) {
    std::string state = pid == 0 ? "not attached" : "pid " + std::to_string(pid) + " still running";
    fail("all-reduce timed out after " + seconds(timeout_s_) + ": rank " + std::to_string(rank_) + " waited for rank " +
         std::to_string(peer) + " (" + state + ") for " + what());
  }
}

template <class Ready, class What>
void Channel::wait_until(Ready ready, const uint32_t* word, int peer, What what) {
  const double started = now_s();
  double next_liveness = started + kLivenessPeriod;
  uint32_t* sleepers = &header()->control[peer].sleepers;
  // With more ranks than cores, a peer we just woke needs a core, perhaps ours: sleep at once rather
  // than spin. Not otherwise: each rank would then sleep because it woke the other, and two ranks
  // with a core each stay in that futex ping-pong (~4x slower) for hundreds of calls.
  const double spin = woke_peer_ && crowded_ ? 0.0 : spin_s_;
  woke_peer_ = false;
  bool slept = false;
  for (uint32_t spins = 1;; ++spins) {
    if (ready()) {
      // Adapt: waits that end while spinning earn a longer spin, waits that needed sleep a shorter one.
      spin_s_ = slept ? std::max(kMinSpinSeconds, spin_s_ / 2) : std::min(max_spin_s_, spin_s_ * 2);
      return;
    }
    if (spins % 64 != 0) {
      cpu_relax();
      continue;
    }
    const double now = now_s();
    check_waiting(now, started, next_liveness, peer, what);
    const double waited = now - started;
    if (waited < spin) {
      cpu_relax();
    } else if (waited < kYieldFactor * spin) {
      spins = 63;  // check the clock after every yield
      sched_yield();
    } else {
      spins = 63;
      slept = true;
      __atomic_fetch_add(sleepers, 1u, __ATOMIC_SEQ_CST);
      const uint32_t seen = __atomic_load_n(word, __ATOMIC_SEQ_CST);
      if (!ready()) {
        struct timespec slice = {0, kSleepSliceNs};
        syscall(SYS_futex, word, FUTEX_WAIT, seen, &slice, nullptr, 0);
      }
      __atomic_fetch_sub(sleepers, 1u, __ATOMIC_SEQ_CST);
    }
  }
}

void Channel::wake(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  woke_peer_ = true;
}

uint64_t Channel::wait_slow(const FlagLine* f, uint32_t gen, int peer, const Call& c) {
  uint64_t w = 0;
  const uint32_t* word = reinterpret_cast<const uint32_t*>(&f->word);  // the generation half
  wait_until(
      [&] {
        w = __atomic_load_n(&f->word, __ATOMIC_ACQUIRE);
        const int32_t ahead = (int32_t)((uint32_t)w - gen);  // generations compare modulo 2^32
        if (ahead > 0)
          fail("all-reduce out of step: rank " + std::to_string(peer) + " is at call #" +
               std::to_string((uint32_t)w) + " while rank " + std::to_string(rank_) + " is at call #" +
               std::to_string(gen));
        return ahead == 0;
      },
      word, peer, [&] { return "call #" + std::to_string(gen) + " (" + c.describe() + ")"; });
  return w;
}

void Channel::barrier(const char* what) {
  check_usable();
  Header* h = seg_.header();
  const uint32_t b = ++barrier_gen_;
  __atomic_store_n(&h->control[rank_].barrier, b, __ATOMIC_RELEASE);
  notify(&h->control[rank_].barrier);
  for (int p = 0; p < world_; ++p) {
    const uint32_t* word = &h->control[p].barrier;
    wait_until([&] { return (int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - b) >= 0; }, word, p,
               [&] { return std::string("barrier '") + what + "' #" + std::to_string(b); });
  }
  // The last rank to arrive passes without waiting, so without this it would not see a peer that
  // already gave up on this barrier.
  if (__atomic_load_n(&h->abort_rank, __ATOMIC_ACQUIRE) != 0)
    peer_gave_up(std::string("barrier '") + what + "' #" + std::to_string(b));
}

}  // namespace allreduce
}  // namespace drafter_lab
