// The shared-segment protocol of the all-reduce: header, per-rank slots, flag lines, and the
// offsets every backend (CPU, CUDA host-staged, CUDA IPC) computes the same way.
//
// Segment = Header (4 KiB) followed by `world_size` slots. A slot holds two buffers used
// alternately by successive calls (generation & 1), so no call needs an end barrier: a buffer is
// rewritten two calls later, and a rank only starts that call after it has seen every peer's flag
// for the call in between, which peers post only after they finished reading.
// Buffer = flag lines [2 phases][blocks] | staging data (max_bytes) | result area (2 * max_bytes)
//          | LL packets (max_bytes, CUDA backends only).
// The LL area is its own: an LL reader trusts any packet whose flags equal the call's generation,
// so the bytes it polls must never be anything but LL packets (raw staged data could match).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define DL_HD __host__ __device__ __forceinline__
#else
#define DL_HD inline
#endif

namespace drafter_lab {
namespace allreduce {

constexpr uint64_t kMagic = 0x31524144424c4144ull;  // "DLBDAR1" little-endian
constexpr uint32_t kVersion = 2;
constexpr int kMaxRanks = 16;
constexpr int kMaxBlocks = 64;
constexpr size_t kLine = 128;
constexpr size_t kPage = 4096;
constexpr size_t kHeaderBytes = 4096;
constexpr int kIpcHandleBytes = 64;

// Data types on the wire (also the order of `dtype_name`).
enum Dtype : uint32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

enum Backend : uint32_t { kCpu = 0, kCudaHost = 1, kCudaIpc = 2 };

// What a call does; part of the flag signature, so ranks disagreeing on it fail instead of mixing.
enum Kind : uint32_t { kSumOneShot = 0, kSumTwoShot = 1, kFusedOneShot = 2, kFusedTwoShot = 3, kSumLL = 4,
                    kFusedLL = 5 };

// One flag line (128 B, so no two flags share a cache line or a PCIe read). `word` packs the
// uint32 generation (low half) with a uint32 signature of (numel, dtype, kind, hidden) (high half)
// and is written last with release semantics; the other fields say what the writer sent, for errors.
struct alignas(kLine) FlagLine {
  uint64_t word;
  uint64_t numel;
  uint32_t dtype;
  uint32_t kind;
  uint64_t hidden;
  unsigned char pad[kLine - 32];
};
static_assert(sizeof(FlagLine) == kLine, "flag line must be one 128-byte line");

// Per-rank control line: its barrier count, and (in the other 64-byte half, so the spinning
// does not share a cache line with the count) how many waiters sleep on a futex of this rank.
struct alignas(kLine) Control {
  uint32_t barrier;
  unsigned char pad0[64 - 4];
  uint32_t sleepers;
  unsigned char pad1[64 - 4];
};

struct Header {
  uint64_t magic;  // written last by the creator (release): the header is complete
  uint32_t version;
  uint32_t world_size;
  uint64_t max_bytes;  // staging capacity per buffer, rounded to a page
  uint64_t slot_bytes;
  uint64_t total_bytes;
  uint32_t blocks;
  uint32_t backend;  // a Backend; with kCudaIpc data moves through device buffers, the segment only controls
  int32_t creator_pid;
  uint32_t attached;  // ranks currently mapped; the last to leave an unfinished init unlinks
  alignas(kLine) int32_t pids[kMaxRanks];
  alignas(kLine) int32_t abort_rank;  // 0 = fine, r + 1 = rank r gave up; abort_msg says why
  char abort_msg[252];
  Control control[kMaxRanks];
  unsigned char ipc_handle[kMaxRanks][kIpcHandleBytes];
  uint64_t ipc_ptr[kMaxRanks];  // device address in the owner process (same-process peers use it)
  int32_t ipc_device[kMaxRanks];
  // The creator's pid namespace (segment.h, pid_namespace): its pids mean nothing in another one,
  // where kill() answers for an unrelated process or none. Last, so older segments read 0 here.
  uint32_t pid_ns;
};
static_assert(sizeof(Header) <= kHeaderBytes, "header must fit its page");

DL_HD size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Offsets inside the slots region (the segment after the header, or an IPC device buffer).
struct Layout {
  uint64_t max_bytes;  // page-rounded staging bytes per buffer
  uint64_t slot_bytes;
  uint32_t blocks;
  bool with_ll;  // the buffers end in an LL area (CUDA backends)

  DL_HD static Layout make(uint64_t max_bytes, uint32_t blocks, bool with_ll) {
    Layout l;
    l.max_bytes = round_up(max_bytes, kPage);
    l.blocks = blocks;
    l.with_ll = with_ll;
    l.slot_bytes = 2 * l.buffer_bytes();
    return l;
  }
  DL_HD uint64_t flags_bytes() const { return round_up(2 * (uint64_t)blocks * kLine, kPage); }
  DL_HD uint64_t buffer_bytes() const { return flags_bytes() + (with_ll ? 4 : 3) * max_bytes; }
  // Per-block staging stride for the CUDA kernels (block b owns [b*stride, (b+1)*stride)).
  DL_HD uint64_t block_stride() const { return max_bytes / blocks / 16 * 16; }

  DL_HD char* buffer(char* base, int rank, uint32_t gen) const {
    return base + (uint64_t)rank * slot_bytes + (gen & 1u) * buffer_bytes();
  }
  DL_HD FlagLine* flag(char* base, int rank, uint32_t gen, int phase, int block) const {
    return reinterpret_cast<FlagLine*>(buffer(base, rank, gen)) + phase * blocks + block;
  }
  DL_HD char* data(char* base, int rank, uint32_t gen) const { return buffer(base, rank, gen) + flags_bytes(); }
  DL_HD char* result(char* base, int rank, uint32_t gen) const { return data(base, rank, gen) + max_bytes; }
  // LL packets; block b owns [b * block_stride(), (b + 1) * block_stride()) as in staging.
  DL_HD char* ll(char* base, int rank, uint32_t gen) const { return data(base, rank, gen) + 3 * max_bytes; }
};

DL_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// Signature of a call: every rank must send the same total numel, dtype, kind and row width.
DL_HD uint32_t signature(uint64_t numel, uint32_t dtype, uint32_t kind, uint64_t hidden) {
  uint32_t h = fmix32((uint32_t)numel ^ 0x9e3779b9u);
  h = fmix32(h ^ (uint32_t)(numel >> 32));
  h = fmix32(h ^ (dtype * 0x01000193u + kind * 0x27d4eb2fu));
  return fmix32(h ^ (uint32_t)hidden ^ (uint32_t)(hidden >> 32) * 0x165667b1u);
}

DL_HD uint64_t flag_word(uint32_t gen, uint32_t sig) { return ((uint64_t)sig << 32) | gen; }

// Generations compare modulo 2^32, which is exact only while no flag line lags its writer's
// counter by 2^31 or more. Lines a run of calls leaves unwritten (phase 1 while every call is
// one-shot, high blocks while every call is small) would lag that far after 2^31 calls (days of
// serving) and then read as a peer ahead. So once per kRefreshPeriod generations, before writing
// anything for the call, a writer stamps all its lines of the call's buffer with gen - 2: the last
// call that buffer served, which every peer has finished reading. Its LL packets too: they match a
// generation exactly, so one left unwritten would read as fresh 2^32 calls later.
constexpr uint32_t kRefreshPeriod = 1u << 30;
DL_HD bool refresh_due(uint32_t gen) { return (gen & (kRefreshPeriod - 1)) < 2; }

inline size_t dtype_size(uint32_t dtype) { return dtype == kF32 ? 4 : 2; }

}  // namespace allreduce
}  // namespace drafter_lab
