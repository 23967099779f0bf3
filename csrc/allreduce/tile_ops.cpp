#include "allreduce/tile_ops.h"

#include <c10/util/Half.h>

#include <cmath>
#include <cstring>

#include "allreduce/layout.h"
#include "cpu_isa.h"

#if defined(DRAFTER_LAB_AVX2)
#include <immintrin.h>
#endif

namespace drafter_lab {
namespace allreduce {
namespace {

struct F32 {
  using T = float;
  static float load(float x) { return x; }
  static float store(float x) { return x; }
};

// NaN -> 0x7fc0, else round-to-nearest-even: what torch's float -> bfloat16 does.
struct BF16 {
  using T = uint16_t;
  static float load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t store(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return std::isnan(f) ? (uint16_t)0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

struct F16 {
  using T = uint16_t;
  static float load(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }
  static uint16_t store(float f) { return c10::detail::fp16_ieee_from_fp32_value(f); }
};

// Bodies shared by the portable and the AVX2 builds (inlined into each, vectorized for each).
template <class D>
__attribute__((always_inline)) inline void load_body(const void* src, float* acc, int64_t n) {
  const auto* s = static_cast<const typename D::T*>(src);
  for (int64_t j = 0; j < n; ++j) acc[j] = D::load(s[j]);
}
template <class D>
__attribute__((always_inline)) inline void add_body(const void* src, float* acc, int64_t n) {
  const auto* s = static_cast<const typename D::T*>(src);
  for (int64_t j = 0; j < n; ++j) acc[j] += D::load(s[j]);
}
template <class D>
__attribute__((always_inline)) inline void store_body(const float* acc, void* dst, int64_t n) {
  auto* d = static_cast<typename D::T*>(dst);
  for (int64_t j = 0; j < n; ++j) d[j] = D::store(acc[j]);
}

template <class D>
void load_portable(const void* s, float* a, int64_t n) { load_body<D>(s, a, n); }
template <class D>
void add_portable(const void* s, float* a, int64_t n) { add_body<D>(s, a, n); }
template <class D>
void store_portable(const float* a, void* d, int64_t n) { store_body<D>(a, d, n); }

#if defined(DRAFTER_LAB_AVX2)
template <class D>
DRAFTER_LAB_AVX2 void load_avx2(const void* s, float* a, int64_t n) { load_body<D>(s, a, n); }
template <class D>
DRAFTER_LAB_AVX2 void add_avx2(const void* s, float* a, int64_t n) { add_body<D>(s, a, n); }
template <class D>
DRAFTER_LAB_AVX2 void store_avx2(const float* a, void* d, int64_t n) { store_body<D>(a, d, n); }

// float16 needs the F16C instructions spelled out: the compiler does not vectorize them.
DRAFTER_LAB_AVX2 void f16_load_avx2(const void* src, float* acc, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(acc + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + j))));
  for (; j < n; ++j) acc[j] = _cvtsh_ss(s[j]);
}
DRAFTER_LAB_AVX2 void f16_add_avx2(const void* src, float* acc, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + j)));
    _mm256_storeu_ps(acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), v));
  }
  for (; j < n; ++j) acc[j] += _cvtsh_ss(s[j]);
}
DRAFTER_LAB_AVX2 void f16_store_avx2(const float* acc, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j), _mm256_cvtps_ph(_mm256_loadu_ps(acc + j), _MM_FROUND_TO_NEAREST_INT));
  for (; j < n; ++j) d[j] = _cvtss_sh(acc[j], _MM_FROUND_TO_NEAREST_INT);
}
#endif

template <class D>
TileOps portable() {
  return {&load_portable<D>, &add_portable<D>, &store_portable<D>};
}

struct Table {
  TileOps ops[3];
  Table() {
    ops[kF32] = portable<F32>();
    ops[kBF16] = portable<BF16>();
    ops[kF16] = portable<F16>();
#if defined(DRAFTER_LAB_AVX2)
    if (cpu_has_avx2()) {
      ops[kF32] = {&load_avx2<F32>, &add_avx2<F32>, &store_avx2<F32>};
      ops[kBF16] = {&load_avx2<BF16>, &add_avx2<BF16>, &store_avx2<BF16>};
      ops[kF16] = {&f16_load_avx2, &f16_add_avx2, &f16_store_avx2};
    }
#endif
  }
};

}  // namespace

const TileOps& tile_ops(uint32_t dtype) {
  static const Table table;
  return table.ops[dtype];
}

}  // namespace allreduce
}  // namespace drafter_lab
