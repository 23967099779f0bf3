#include "allreduce/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

namespace drafter_lab {
namespace allreduce {
namespace {

std::string errno_text() { return std::strerror(errno); }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Maps `bytes` of an open shm fd; MAP_POPULATE so the first all-reduce does not pay page faults.
char* map_fd(int fd, size_t bytes, bool writable, bool populate) {
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* p = mmap(nullptr, bytes, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// Another namespace's segment counts as alive: its pids cannot be judged from here, and its own
// namespace cleans it up.
bool foreign(const Header* h) { return h->pid_ns != 0 && pid_namespace() != 0 && h->pid_ns != pid_namespace(); }

bool header_alive(const Header* h) {
  if (foreign(h) || pid_alive(h->creator_pid)) return true;
  for (uint32_t r = 0; r < h->world_size && r < (uint32_t)kMaxRanks; ++r)
    if (pid_alive(__atomic_load_n(&h->pids[r], __ATOMIC_ACQUIRE))) return true;
  return false;
}

// Rank 0 waits for `rank` in its init barrier: tell it why this rank gives up, or it times out
// blaming a rank "not attached". Only from a seat of its group that no live process holds (that no
// process holds, where its pids cannot be judged).
void abort_from_seat(int fd, int rank, const std::string& message, bool judge_pids) {
  if (char* wp = map_fd(fd, kHeaderBytes, true, false)) {
    auto* wh = reinterpret_cast<Header*>(wp);
    const int32_t seat = __atomic_load_n(&wh->pids[rank], __ATOMIC_ACQUIRE);
    if (seat == 0 || (judge_pids && !pid_alive(seat))) record_abort(wh, rank, message);
    munmap(wp, kHeaderBytes);
  }
}

// True when the segment `name` (without leading '/') belongs to nobody alive any more.
bool is_stale(const std::string& shm_name, double min_age_s) {
  int fd = shm_open(shm_name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  struct stat st;
  bool stale = false;
  if (fstat(fd, &st) == 0) {
    double age = (double)time(nullptr) - (double)st.st_mtime;
    if ((size_t)st.st_size < kHeaderBytes) {
      stale = age > min_age_s;
    } else if (char* p = map_fd(fd, kHeaderBytes, false, false)) {
      auto* h = reinterpret_cast<const Header*>(p);
      if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic)
        stale = age > min_age_s;
      else
        stale = !header_alive(h);
      munmap(p, kHeaderBytes);
    }
  }
  close(fd);
  return stale;
}

}  // namespace

void record_abort(Header* h, int rank, const std::string& message) {
  int32_t expected = 0;
  if (__atomic_compare_exchange_n(&h->abort_rank, &expected, -1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    std::strncpy(h->abort_msg, message.c_str(), sizeof(h->abort_msg) - 1);
    h->abort_msg[sizeof(h->abort_msg) - 1] = 0;
    __atomic_store_n(&h->abort_rank, rank + 1, __ATOMIC_RELEASE);
  }
}

bool pid_alive(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  // An exited child its parent has not reaped yet still answers kill(); /proc says 'Z'.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');
  return !(close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

uint32_t pid_namespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint32_t)st.st_ino : 0;
}

std::string segment_name(const std::string& tag) {
  if (tag.empty() || tag.size() > 200) throw CommError("segment tag must have 1 to 200 characters");
  for (char c : tag)
    if (!(isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'))
      throw CommError("segment tag '" + tag + "' may only hold letters, digits, '-', '_' and '.'");
  return std::string("/") + kNamePrefix + tag;
}

std::string unique_segment_name() {
  std::random_device rd;
  uint64_t r = ((uint64_t)rd() << 32) ^ rd();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%d.%016llx", (int)getpid(), (unsigned long long)r);
  return segment_name(buf);
}

std::vector<std::string> cleanup_stale(double min_age_s) {
  std::vector<std::string> removed;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return removed;
  const size_t plen = std::strlen(kNamePrefix);
  while (struct dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kNamePrefix, plen) != 0) continue;
    std::string name = std::string("/") + e->d_name;
    if (is_stale(name, min_age_s) && shm_unlink(name.c_str()) == 0) removed.push_back(name);
  }
  closedir(dir);
  return removed;
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unmap();
    name_ = std::move(o.name_);
    base_ = o.base_;
    size_ = o.size_;
    unlinked_ = o.unlinked_;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

Segment Segment::create(const std::string& name, int world_size, uint64_t max_bytes, uint32_t blocks,
                        uint32_t backend) {
  Layout layout = Layout::make(max_bytes, blocks, backend != kCpu);
  size_t total = kHeaderBytes + (backend != kCudaIpc ? (size_t)world_size * layout.slot_bytes : 0);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    // A segment without its header yet may be another creator's between shm_open and the stamp:
    // unlinking it would leave both believing they created the one their peers attach to.
    if (!is_stale(name, kCreatingS))
      throw CommError("shared-memory segment " + name + " is in use by a live process or still being created "
                      "(another run with the same name?)");
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) throw CommError("cannot create shared-memory segment " + name + ": " + errno_text());
  // posix_fallocate reserves the pages now: a full /dev/shm fails here instead of SIGBUS later.
  int rc = ftruncate(fd, (off_t)total) == 0 ? posix_fallocate(fd, 0, (off_t)total) : errno;
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    throw CommError("cannot size shared-memory segment " + name + " to " + std::to_string(total) +
                    " bytes (is /dev/shm large enough?): " + std::strerror(rc));
  }
  char* p = map_fd(fd, total, true, true);
  close(fd);
  if (!p) {
    shm_unlink(name.c_str());
    throw CommError("cannot map shared-memory segment " + name + ": " + errno_text());
  }
  auto* h = reinterpret_cast<Header*>(p);
  h->version = kVersion;
  h->world_size = (uint32_t)world_size;
  h->max_bytes = layout.max_bytes;
  h->slot_bytes = layout.slot_bytes;
  h->total_bytes = total;
  h->blocks = blocks;
  h->backend = backend;
  h->creator_pid = (int32_t)getpid();
  h->pid_ns = pid_namespace();
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
  Segment s;
  s.name_ = name;
  s.base_ = p;
  s.size_ = total;
  return s;
}

Segment Segment::attach(const std::string& name, int world_size, int rank, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  std::string waiting_for = "to appear";
  while (true) {
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd >= 0) {
      struct stat st;
      char* hp = nullptr;
      if (fstat(fd, &st) == 0 && (size_t)st.st_size >= kHeaderBytes) hp = map_fd(fd, kHeaderBytes, false, false);
      if (hp) {
        auto* h = reinterpret_cast<const Header*>(hp);
        bool ready = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kMagic;
        if (ready && foreign(h)) {
          // Liveness, seats and same-process peers all compare pids: one group, one namespace.
          const std::string message = "shared-memory segment " + name + " was created in another pid namespace (" +
                                      std::to_string(h->pid_ns) + ", this process: " +
                                      std::to_string(pid_namespace()) +
                                      "): all ranks must share one (run the containers with a shared pid namespace)";
          const bool in_group = rank < (int)h->world_size && rank < kMaxRanks;
          munmap(hp, kHeaderBytes);
          if (in_group) abort_from_seat(fd, rank, message, /*judge_pids=*/false);
          close(fd);
          throw CommError(message);
        }
        bool creator_alive = ready && pid_alive(h->creator_pid);
        uint32_t ws = h->world_size, version = h->version;
        uint64_t total = h->total_bytes;
        // Only our rank writes its barrier count: set, an earlier communicator of ours already
        // joined this segment (a live other pid in the seat is a second process of our rank,
        // which the Channel refuses by name).
        bool seat_used = false;
        if (ready && version == kVersion && rank < kMaxRanks &&
            __atomic_load_n(&h->control[rank].barrier, __ATOMIC_ACQUIRE) != 0) {
          const int32_t pid = __atomic_load_n(&h->pids[rank], __ATOMIC_ACQUIRE);
          seat_used = pid == 0 || pid == (int32_t)getpid() || !pid_alive(pid);
        }
        munmap(hp, kHeaderBytes);
        if (ready && !creator_alive) waiting_for = "to be recreated (its creator is dead)";
        if (seat_used)
          waiting_for = "to be recreated (rank " + std::to_string(rank) + " already joined the one there)";
        if (ready && creator_alive && !seat_used) {
          if (version != kVersion) {  // another drafter_lab's layout (the LL area came with version 2)
            close(fd);
            throw CommError("shared-memory segment " + name + " has layout version " + std::to_string(version) +
                            ", this drafter_lab reads version " + std::to_string(kVersion) +
                            ": all ranks must run one drafter_lab");
          }
          if ((int)ws != world_size) {
            const std::string message = "shared-memory segment " + name + " was created for world size " +
                                        std::to_string(ws) + ", rank " + std::to_string(rank) + " expects " +
                                        std::to_string(world_size);
            if (rank < (int)ws && rank < kMaxRanks) abort_from_seat(fd, rank, message, /*judge_pids=*/true);
            close(fd);
            throw CommError(message);
          }
          char* p = (size_t)st.st_size >= total ? map_fd(fd, total, true, true) : nullptr;
          close(fd);
          if (!p) throw CommError("cannot map shared-memory segment " + name + ": " + errno_text());
          Segment s;
          s.name_ = name;
          s.base_ = p;
          s.size_ = total;
          return s;
        }
      }
      close(fd);
    }
    if (now_s() > deadline) {
      char t[32];
      std::snprintf(t, sizeof(t), "%.3g", timeout_s);
      throw CommError("shared-memory segment " + name + " did not become ready within " + t + " s: waited for it " +
                      waiting_for + " (is rank 0 running?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Segment::unlink() {
  if (!unlinked_ && !name_.empty()) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

void Segment::unmap() {
  if (base_) {
    munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }
}

}  // namespace allreduce
}  // namespace drafter_lab
