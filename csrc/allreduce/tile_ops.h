// Conversions between a wire dtype and the fp32 accumulator, over runs of elements. Chosen once
// per process: AVX2 (+F16C for float16) where the CPU has it, portable autovectorized code
// elsewhere. Rounding is round-to-nearest-even either way, bit-identical to torch's casts.
#pragma once

#include <cstdint>

namespace drafter_lab {
namespace allreduce {

struct TileOps {
  void (*load)(const void* src, float* acc, int64_t n);  // acc = float(src)
  void (*add)(const void* src, float* acc, int64_t n);   // acc += float(src)
  void (*store)(const float* acc, void* dst, int64_t n);  // dst = round(acc)
};

const TileOps& tile_ops(uint32_t dtype);

}  // namespace allreduce
}  // namespace drafter_lab
