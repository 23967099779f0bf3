// CPU backend: processes on one host exchange through the shared segment with acquire/release
// flags. One-shot: everyone stages its input and reduces all of it. Two-shot: everyone reduces
// 1/world of it (reduce-scatter) and copies the other parts from their owners (all-gather).
// Sums run in fp32 in rank order 0..world-1 and round once, so all ranks get identical bits.
#pragma once

#include "allreduce/channel.h"

namespace drafter_lab {
namespace allreduce {

// Runs one call (at most layout().max_bytes of staging) as `c.kind` says.
void cpu_run(Channel& ch, const Call& c);

}  // namespace allreduce
}  // namespace drafter_lab
