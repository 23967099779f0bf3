#include "allreduce/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "allreduce/tile_ops.h"

namespace drafter_lab {
namespace allreduce {
namespace {

// Flag granularity: peers start reducing block b while we still copy block b+1.
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr int kTile = 1024;  // fp32 accumulator tile (4 KB, stays in L1)
constexpr int kLanes = 16;   // fixed partial sums for the RMS, so its order never depends on alignment

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

struct Range {
  uint64_t lo, hi;
};

// Contiguous split of `n` items into `parts` pieces of `align`-multiple size; piece `i`.
Range split(uint64_t n, uint64_t parts, uint64_t align, uint64_t i) {
  const uint64_t per = round_up(ceil_div(n, parts), align);
  const uint64_t lo = std::min(n, i * per);
  return {lo, std::min(n, lo + per)};
}

// How a call's elements map onto flag blocks.
struct Blocks {
  uint64_t per, count;
  uint64_t first(uint64_t elem) const { return elem / per; }
  Range range(uint64_t b, uint64_t numel) const { return {std::min(numel, b * per), std::min(numel, (b + 1) * per)}; }
};

Blocks blocks_for(const Layout& l, uint64_t numel, size_t es) {
  const uint64_t nb = std::min<uint64_t>(std::max<uint64_t>(ceil_div(numel * es, kBlockBytes), 1), l.blocks);
  const uint64_t per = std::max<uint64_t>(round_up(ceil_div(numel, nb), kLine / es), 1);
  return {per, std::max<uint64_t>(ceil_div(numel, per), 1)};
}

class Run {
 public:
  Run(Channel& ch, const Call& c)
      : ch_(ch), c_(c), l_(ch.layout()), me_(ch.rank()), w_(ch.world()), gen_(ch.next_generation()),
        sig_(c.sig()), es_(dtype_size(c.dtype)), blocks_(blocks_for(l_, c.numel, es_)), ops_(tile_ops(c.dtype)) {
    for (int p = 0; p < w_; ++p)
      src_[p] = p == me_ ? static_cast<const char*>(c.in) : l_.data(ch.slots(), p, gen_);
  }

  void operator()() {
    stage();
    wait_headers();
    switch (c_.kind) {
      case kSumOneShot: sum_one_shot(); break;
      case kSumTwoShot: sum_two_shot(); break;
      case kFusedOneShot: fused_one_shot(); break;
      case kFusedTwoShot: fused_two_shot(); break;
    }
  }

 private:
  // Copy our input into our slot block by block, releasing each block's flag behind it.
  void stage() {
    if (refresh_due(gen_)) ch_.refresh_lines(gen_);
    ch_.write_header(gen_, c_);
    char* dst = l_.data(ch_.slots(), me_, gen_);
    const char* src = static_cast<const char*>(c_.in);
    for (uint64_t b = 0; b < blocks_.count; ++b) {
      Range r = blocks_.range(b, c_.numel);
      if (w_ > 1) std::memcpy(dst + r.lo * es_, src + r.lo * es_, (r.hi - r.lo) * es_);
      ch_.publish(l_.flag(ch_.slots(), me_, gen_, 0, (int)b), gen_, sig_);
    }
  }

  // Block 0 of every peer first: its signature check catches mismatched calls before any read.
  void wait_headers() {
    for (int p = 0; p < w_; ++p)
      if (p != me_) ch_.wait_flag(l_.flag(ch_.slots(), p, gen_, 0, 0), gen_, p, c_);
  }

  void wait_staged(Range r) {
    if (r.hi <= r.lo) return;
    for (uint64_t b = blocks_.first(r.lo); b <= blocks_.first(r.hi - 1); ++b)
      for (int p = 0; p < w_; ++p)
        if (p != me_) ch_.wait_flag(l_.flag(ch_.slots(), p, gen_, 0, (int)b), gen_, p, c_);
  }

  void reduce(Range r, char* out) {
    float acc[kTile];
    for (uint64_t i = r.lo; i < r.hi; i += kTile) {
      const int64_t m = (int64_t)std::min<uint64_t>(kTile, r.hi - i);
      ops_.load(src_[0] + i * es_, acc, m);
      for (int p = 1; p < w_; ++p) ops_.add(src_[p] + i * es_, acc, m);
      ops_.store(acc, out + i * es_, m);
    }
  }

  // sum over ranks + residual -> residual_out; rmsnorm(sum + residual) * weight -> out; fp32 inside.
  void fused_rows(uint64_t row_lo, uint64_t row_hi, char* out, char* res_out) {
    const uint64_t H = c_.hidden;
    static thread_local std::vector<float> acc_buf, weight_buf;
    acc_buf.resize(H);
    weight_buf.resize(H);
    float* a = acc_buf.data();
    float* w = weight_buf.data();
    ops_.load(c_.weight, w, (int64_t)H);
    for (uint64_t row = row_lo; row < row_hi; ++row) {
      const uint64_t off = row * H * es_;
      ops_.load(src_[0] + off, a, (int64_t)H);
      for (int p = 1; p < w_; ++p) ops_.add(src_[p] + off, a, (int64_t)H);
      ops_.add(static_cast<const char*>(c_.residual) + off, a, (int64_t)H);
      ops_.store(a, res_out + off, (int64_t)H);
      float lanes[kLanes] = {};
      uint64_t j = 0;
      for (; j + kLanes <= H; j += kLanes)
        for (int k = 0; k < kLanes; ++k) lanes[k] += a[j + k] * a[j + k];
      for (; j < H; ++j) lanes[j % kLanes] += a[j] * a[j];
      for (int s = kLanes / 2; s > 0; s /= 2)
        for (int k = 0; k < s; ++k) lanes[k] += lanes[k + s];
      const float inv = 1.0f / std::sqrt(lanes[0] / (float)H + c_.eps);
      for (uint64_t k = 0; k < H; ++k) a[k] = a[k] * inv * w[k];
      ops_.store(a, out + off, (int64_t)H);
    }
  }

  void sum_one_shot() {
    char* out = static_cast<char*>(c_.out);
    for (uint64_t b = 0; b < blocks_.count; ++b) {
      Range r = blocks_.range(b, c_.numel);
      wait_staged(r);
      reduce(r, out);
    }
  }

  // Each rank owns one contiguous part: reduce it into its result area, then copy the others'.
  void sum_two_shot() {
    char* out = static_cast<char*>(c_.out);
    const uint64_t align = kLine / es_;
    Range mine = split(c_.numel, w_, align, me_);
    wait_staged(mine);
    reduce(mine, out);
    char* my_result = l_.result(ch_.slots(), me_, gen_);
    if (w_ > 1) std::memcpy(my_result + mine.lo * es_, out + mine.lo * es_, (mine.hi - mine.lo) * es_);
    ch_.publish(l_.flag(ch_.slots(), me_, gen_, 1, 0), gen_, sig_);
    for (int p = 0; p < w_; ++p) {
      if (p == me_) continue;
      Range r = split(c_.numel, w_, align, p);
      ch_.wait_flag(l_.flag(ch_.slots(), p, gen_, 1, 0), gen_, p, c_);
      const char* theirs = l_.result(ch_.slots(), p, gen_);
      std::memcpy(out + r.lo * es_, theirs + r.lo * es_, (r.hi - r.lo) * es_);
    }
  }

  void fused_one_shot() {
    const uint64_t rows = c_.numel / c_.hidden;
    wait_staged({0, c_.numel});
    fused_rows(0, rows, static_cast<char*>(c_.out), static_cast<char*>(c_.residual_out));
  }

  // Rows are split among ranks; results (normed rows, then residual rows) go through result areas.
  void fused_two_shot() {
    const uint64_t H = c_.hidden, rows = c_.numel / H;
    char* out = static_cast<char*>(c_.out);
    char* res_out = static_cast<char*>(c_.residual_out);
    Range mine = split(rows, w_, 1, me_);
    wait_staged({mine.lo * H, mine.hi * H});
    fused_rows(mine.lo, mine.hi, out, res_out);
    char* my_result = l_.result(ch_.slots(), me_, gen_);
    const uint64_t off = mine.lo * H * es_, n = (mine.hi - mine.lo) * H * es_;
    if (w_ > 1) {
      std::memcpy(my_result + off, out + off, n);
      std::memcpy(my_result + l_.max_bytes + off, res_out + off, n);
    }
    ch_.publish(l_.flag(ch_.slots(), me_, gen_, 1, 0), gen_, sig_);
    for (int p = 0; p < w_; ++p) {
      if (p == me_) continue;
      Range r = split(rows, w_, 1, p);
      ch_.wait_flag(l_.flag(ch_.slots(), p, gen_, 1, 0), gen_, p, c_);
      const char* theirs = l_.result(ch_.slots(), p, gen_);
      const uint64_t o = r.lo * H * es_, m = (r.hi - r.lo) * H * es_;
      std::memcpy(out + o, theirs + o, m);
      std::memcpy(res_out + o, theirs + l_.max_bytes + o, m);
    }
  }

  Channel& ch_;
  const Call& c_;
  const Layout l_;
  const int me_, w_;
  const uint32_t gen_, sig_;
  const size_t es_;
  const Blocks blocks_;
  const TileOps& ops_;
  const char* src_[kMaxRanks];
};

}  // namespace

void cpu_run(Channel& ch, const Call& c) {
  ch.check_usable();
  Run(ch, c)();
}

}  // namespace allreduce
}  // namespace drafter_lab
