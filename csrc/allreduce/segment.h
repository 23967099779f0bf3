// The POSIX shared-memory segment: create (rank 0), attach (other ranks), unlink, and the
// cleanup of segments left behind by killed runs.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "allreduce/layout.h"

namespace drafter_lab {
namespace allreduce {

// Every failure users can meet (timeouts, dead peers, mismatched calls, segment trouble).
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr const char* kNamePrefix = "drafter_lab_ar.";
// A segment of our name without its header yet is taken to be mid-creation for this long (create
// stamps the header within milliseconds; a run killed before that leaves one that ages out).
constexpr double kCreatingS = 5.0;

// "/drafter_lab_ar.<tag>" from a user tag (letters, digits, '-', '_', '.').
std::string segment_name(const std::string& tag);
// A fresh name "/drafter_lab_ar.<pid>.<random>".
std::string unique_segment_name();

bool pid_alive(int pid);

// This process's pid namespace (the inode of /proc/self/ns/pid, truncated; 0 where unreadable).
// Containers that share /dev/shm but not their pids see one segment from two namespaces.
uint32_t pid_namespace();

// Records on the segment that `rank` gave up (the first to give up wins), so peers waiting on it
// raise `message` at once instead of timing out.
void record_abort(Header* h, int rank, const std::string& message);

// Removes segments with our prefix whose creator and ranks are all dead (or that were never
// initialised and are older than `min_age_s`). Returns the names removed.
std::vector<std::string> cleanup_stale(double min_age_s = 30.0);

class Segment {
 public:
  // Rank 0: creates `name` (a stale segment of that name is replaced; a live one, or one younger
  // than kCreatingS without its header, is an error).
  static Segment create(const std::string& name, int world_size, uint64_t max_bytes, uint32_t blocks,
                        uint32_t backend);
  // Other ranks: waits up to `timeout_s` for `name` to exist with a live creator, then maps it.
  // A segment where `rank` already joined the init barrier is an earlier group's that rank 0 has
  // not unlinked yet (the name reused at once): it waits for rank 0's fresh one instead.
  static Segment attach(const std::string& name, int world_size, int rank, double timeout_s);

  Segment() = default;
  Segment(Segment&& o) noexcept { *this = static_cast<Segment&&>(o); }
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() { unmap(); }

  Header* header() const { return reinterpret_cast<Header*>(base_); }
  char* base() const { return base_; }
  char* slots() const { return base_ + kHeaderBytes; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  Layout layout() const { return Layout::make(header()->max_bytes, header()->blocks, header()->backend != kCpu); }

  void unlink();  // remove the name (mappings stay valid); idempotent
  void unmap();

 private:
  std::string name_;
  char* base_ = nullptr;
  size_t size_ = 0;
  bool unlinked_ = false;
};

}  // namespace allreduce
}  // namespace drafter_lab
