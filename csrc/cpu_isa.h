// Which vector build the CPU loops run, decided once at load: AVX2 with FMA and F16C (x86 CPUs since
// 2013, Intel and AMD) or the portable one. GCC's target_clones("arch=haswell") would not do: its
// resolver tests the CPU model, not its features, and picks the portable clone on all but Haswell.
#pragma once

namespace drafter_lab {

#if defined(__GNUC__) && defined(__x86_64__)
#define DRAFTER_LAB_AVX2 __attribute__((target("avx2,fma,f16c")))

inline bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#else
inline bool cpu_has_avx2() { return false; }
#endif

}  // namespace drafter_lab
