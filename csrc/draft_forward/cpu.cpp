// CPU implementation of drafter_lab::draft_step: the reference math of
// drafter_lab/drafter/model.py (Eagle3Drafter.draft_step), rounding to the model dtype wherever the
// PyTorch reference materialises a tensor in that dtype, accumulating in fp32, parallel with
// at::parallel_for.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "cpu_isa.h"
#include "draft_forward/args.h"

namespace drafter_lab::draft_forward {
namespace {

// The hot loops are written once (always inlined) and built twice, portable and AVX2+FMA; loops()
// picks a build at load time (cpu_isa.h).
#define DRAFTER_LAB_HOT __attribute__((always_inline)) inline

// Eight floats as one GCC/Clang vector: AVX in the AVX2 build, two SSE halves otherwise.
typedef float v8f __attribute__((vector_size(32)));

DRAFTER_LAB_HOT v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// sum_k x[k] * w[k]. One row alone (attention scores): four independent accumulators keep the FMAs'
// latency hidden, so the loop runs at load speed instead of doing four rows' work.
DRAFTER_LAB_HOT float dot1_body(const float* x, const float* w, int64_t n) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    a0 += load8(x + k) * load8(w + k);
    a1 += load8(x + k + 8) * load8(w + k + 8);
    a2 += load8(x + k + 16) * load8(w + k + 16);
    a3 += load8(x + k + 24) * load8(w + k + 24);
  }
  for (; k + 8 <= n; k += 8) a0 += load8(x + k) * load8(w + k);
  const v8f a = (a0 + a1) + (a2 + a3);
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += a[j];
  for (; k < n; ++k) sum += x[k] * w[k];
  return sum;
}

// y[r] = x . w[r] for eight rows (batch 1, where the loads bound the time): eight weight streams in
// flight read about 40 % faster than two, and eight accumulators cover the FMAs' latency. The sum
// runs in dot4x4's order, so a row's result does not depend on the batch.
DRAFTER_LAB_HOT void dot1x8_body(const float* x, const float* const* w, int64_t n, float* y) {
  v8f a[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const v8f xv = load8(x + k);
    for (int r = 0; r < 8; ++r) a[r] += xv * load8(w[r] + k);
  }
  for (int r = 0; r < 8; ++r) {
    float s = 0;
    for (int j = 0; j < 8; ++j) s += a[r][j];
    for (int64_t t = k; t < n; ++t) s += x[t] * w[r][t];
    y[r] = s;
  }
}

// y[b * 4 + r] = x[b] . w[r] for b < nb <= 4 and four weight rows (batches past nb re-read row 0
// and are dropped): the four rows share every load of x (0.5 loads per FMA) and stream together,
// which reads 10-20 % faster than two rows at a time.
DRAFTER_LAB_HOT void dot4x4_body(const float* x, int64_t ldx, int nb, const float* const* w, int64_t n, float* y) {
  const float* xr[4] = {x, x + (nb > 1 ? ldx : 0), x + (nb > 2 ? 2 * ldx : 0), x + (nb > 3 ? 3 * ldx : 0)};
  v8f a[4][4] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    v8f u[4];
    for (int r = 0; r < 4; ++r) u[r] = load8(w[r] + k);
    for (int b = 0; b < 4; ++b) {
      const v8f xv = load8(xr[b] + k);
      for (int r = 0; r < 4; ++r) a[b][r] += xv * u[r];
    }
  }
  for (int b = 0; b < nb; ++b) {
    for (int r = 0; r < 4; ++r) {
      float s = 0;
      for (int j = 0; j < 8; ++j) s += a[b][r][j];
      for (int64_t t = k; t < n; ++t) s += xr[b][t] * w[r][t];
      y[b * 4 + r] = s;
    }
  }
}

DRAFTER_LAB_HOT void widen_bf16_body(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    dst[i] = f;
  }
}

struct Loops {
  float (*dot1)(const float*, const float*, int64_t);
  void (*dot1x8)(const float*, const float* const*, int64_t, float*);
  void (*dot4x4)(const float*, int64_t, int, const float* const*, int64_t, float*);
  void (*widen_bf16)(const uint16_t*, int64_t, float*);
};

// One build of the loops per instruction set: ATTR is empty or DRAFTER_LAB_AVX2.
#define DRAFTER_LAB_LOOPS(NAME, ATTR)                                                                    \
  ATTR float NAME##_dot1(const float* x, const float* w, int64_t n) { return dot1_body(x, w, n); }     \
  ATTR void NAME##_dot1x8(const float* x, const float* const* w, int64_t n, float* y) {                 \
    dot1x8_body(x, w, n, y);                                                                          \
  }                                                                                                   \
  ATTR void NAME##_dot4x4(const float* x, int64_t ldx, int nb, const float* const* w, int64_t n,      \
                          float* y) {                                                                 \
    dot4x4_body(x, ldx, nb, w, n, y);                                                                 \
  }                                                                                                   \
  ATTR void NAME##_widen_bf16(const uint16_t* s, int64_t n, float* d) { widen_bf16_body(s, n, d); }    \
  constexpr Loops NAME##_loops{&NAME##_dot1, &NAME##_dot1x8, &NAME##_dot4x4, &NAME##_widen_bf16};

DRAFTER_LAB_LOOPS(portable, )
#if defined(DRAFTER_LAB_AVX2)
DRAFTER_LAB_LOOPS(avx2, DRAFTER_LAB_AVX2)
#endif

const Loops& loops() {
#if defined(DRAFTER_LAB_AVX2)
  static const Loops& chosen = cpu_has_avx2() ? avx2_loops : portable_loops;
  return chosen;
#else
  return portable_loops;
#endif
}

template <typename T>
void widen(const T* src, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(src, src + n, dst);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    loops().widen_bf16(reinterpret_cast<const uint16_t*>(src), n, dst);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

// Rounds an fp32 value to T and back: where the reference stores a tensor in the model dtype.
template <typename T>
inline float rnd(float x) {
  return static_cast<float>(static_cast<T>(x));
}

// y[b, n] = rnd(sum_k x[b, k] * W[n, k]), fp32 accumulation; x is [B, K] fp32, W is [N, K] T.
template <typename T>
void linear(const std::vector<float>& x, int64_t B, const T* W, int64_t N, int64_t K, float* y) {
  // Weight rows go in groups, each read once for the whole batch: eight at batch 1 (dot1x8), else
  // four (dot4x4). A last short group repeats its last row, and those results are dropped.
  const int64_t G = B == 1 ? 8 : 4;
  const int64_t grain = std::max<int64_t>(1, std::max<int64_t>(2, (1 << 16) / std::max<int64_t>(K, 1)) / G);
  at::parallel_for(0, (N + G - 1) / G, grain, [&](int64_t g0, int64_t g1) {
    std::vector<float> rows(std::is_same_v<T, float> ? 0 : G * K);
    const float* w[8];
    float out[16];
    for (int64_t n = g0 * G; n < std::min(g1 * G, N); n += G) {
      const int64_t m = std::min(G, N - n);
      for (int64_t r = 0; r < G; ++r) {
        if (r >= m) {
          w[r] = w[m - 1];
        } else if constexpr (std::is_same_v<T, float>) {
          w[r] = W + (n + r) * K;
        } else {
          widen(W + (n + r) * K, K, rows.data() + r * K);
          w[r] = rows.data() + r * K;
        }
      }
      if (B == 1) {
        loops().dot1x8(x.data(), w, K, out);
        for (int64_t r = 0; r < m; ++r) y[n + r] = rnd<T>(out[r]);
        continue;
      }
      for (int64_t b = 0; b < B; b += 4) {
        const int nb = static_cast<int>(std::min<int64_t>(4, B - b));
        loops().dot4x4(x.data() + b * K, K, nb, w, K, out);
        for (int i = 0; i < nb; ++i) {
          for (int64_t r = 0; r < m; ++r) y[(b + i) * N + n + r] = rnd<T>(out[i * 4 + r]);
        }
      }
    }
  });
}

template <typename T>
std::vector<float> to_float(const at::Tensor& t) {
  std::vector<float> out(t.numel());
  widen(t.data_ptr<T>(), t.numel(), out.data());
  return out;
}

// RMSNorm of model.py: x * rsqrt(mean(x^2) + eps) in fp32, rounded to T, times the weight.
template <typename T>
void rms_norm(const float* x, int64_t B, int64_t H, int64_t ldo, const T* w, float eps, float* out) {
  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * H;
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(xb[i]) * xb[i];
    const float mean = static_cast<float>(ss) / static_cast<float>(H);
    const float rstd = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < H; ++i) {
      out[b * ldo + i] = rnd<T>(static_cast<float>(w[i]) * rnd<T>(xb[i] * rstd));
    }
  }
}

template <typename I>
std::vector<int64_t> read_index(const at::Tensor& t) {
  const I* p = t.data_ptr<I>();
  return std::vector<int64_t>(p, p + t.numel());
}

std::vector<int64_t> index_values(const at::Tensor& t) {
  return t.scalar_type() == at::kLong ? read_index<int64_t>(t) : read_index<int32_t>(t);
}

// cos/sin of model.py's rope_cos_sin from its frequencies, computed with the same ATen ops on the same
// shapes so that the tables are bit-identical to the reference's: [B, head_dim] each, rounded to T.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, const at::Tensor& inv,
                                              at::ScalarType dtype) {
  const at::Tensor freqs = positions.to(at::kFloat).view({-1, 1, 1}) * inv;
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype).to(at::kFloat).contiguous(), emb.sin().to(dtype).to(at::kFloat).contiguous()};
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> run(const DraftStep& s) {
  const int64_t B = s.batch, H = s.hidden_size, nh = s.n_heads, nkv = s.n_kv, d = s.head_dim;
  const int64_t S = s.cache_size, I = s.inter, N = s.vocab, half = d / 2, rep = nh / nkv;
  const float eps = static_cast<float>(s.eps);
  const std::vector<int64_t> lens = index_values(s.cache_lens);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] < S, "draft_step: cache_lens[", b, "] = ", lens[b],
                " is outside the cache of ", S, " entries");
  }

  // hidden: fc over the aux states (first step) or the previous step's hidden state.
  std::vector<float> hid(B * H);
  if (s.fc) {
    linear<T>(to_float<T>(s.hidden), B, s.fc->data_ptr<T>(), H, s.hidden.size(1), hid.data());
  } else {
    hid = to_float<T>(s.hidden);
  }

  // x = cat(input_layernorm(embeds), hidden_norm(hidden)), then q/k/v.
  std::vector<float> x(B * 2 * H);
  rms_norm<T>(to_float<T>(s.embeds).data(), B, H, 2 * H, s.input_norm.data_ptr<T>(), eps, x.data());
  rms_norm<T>(hid.data(), B, H, 2 * H, s.hidden_norm.data_ptr<T>(), eps, x.data() + H);
  std::vector<float> q(B * nh * d), k(B * nkv * d), v(B * nkv * d);
  linear<T>(x, B, s.q.data_ptr<T>(), nh * d, 2 * H, q.data());
  linear<T>(x, B, s.k.data_ptr<T>(), nkv * d, 2 * H, k.data());
  linear<T>(x, B, s.v.data_ptr<T>(), nkv * d, 2 * H, v.data());

  // RoPE (HF rotate_half): x * cos + cat(-x2, x1) * sin, each product rounded to T.
  const auto [cos_t, sin_t] = rope_tables(s.positions, s.rope_inv_freq, s.dtype);
  const float* cosv = cos_t.data_ptr<float>();
  const float* sinv = sin_t.data_ptr<float>();
  auto rope = [&](std::vector<float>& t, int64_t heads) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        float* p = t.data() + (b * heads + h) * d;
        const float* c = cosv + b * d;
        const float* sn = sinv + b * d;
        for (int64_t e = 0; e < half; ++e) {
          const float x1 = p[e], x2 = p[e + half];
          p[e] = rnd<T>(rnd<T>(x1 * c[e]) + rnd<T>(-x2 * sn[e]));
          p[e + half] = rnd<T>(rnd<T>(x2 * c[e + half]) + rnd<T>(x1 * sn[e + half]));
        }
      }
    }
  };
  rope(q, nh);
  rope(k, nkv);

  // Write this step's k/v at cache_lens[b], then attend over entries 0..cache_lens[b].
  T* kc = s.k_cache.data_ptr<T>();
  T* vc = s.v_cache.data_ptr<T>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < nkv; ++h) {
      const int64_t at_ = ((b * nkv + h) * S + lens[b]) * d;
      for (int64_t e = 0; e < d; ++e) {
        kc[at_ + e] = static_cast<T>(k[(b * nkv + h) * d + e]);
        vc[at_ + e] = static_cast<T>(v[(b * nkv + h) * d + e]);
      }
    }
  }
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  std::vector<float> attn(B * nh * d);
  at::parallel_for(0, B * nh, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> krow(d), scores;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / nh, h = i % nh, g = h / rep, n = lens[b] + 1;
      const T* kb = kc + (b * nkv + g) * S * d;
      const T* vb = vc + (b * nkv + g) * S * d;
      const float* qh = q.data() + i * d;
      scores.resize(n);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        widen(kb + j * d, d, krow.data());
        scores[j] = rnd<T>(rnd<T>(loops().dot1(qh, krow.data(), d)) * scale);
        m = std::max(m, scores[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - m);
        sum += scores[j];
      }
      const float inv = 1.0f / sum;
      float* out = attn.data() + i * d;
      std::fill(out, out + d, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float p = rnd<T>(scores[j] * inv);
        const T* vr = vb + j * d;
        for (int64_t e = 0; e < d; ++e) out[e] += p * static_cast<float>(vr[e]);
      }
      for (int64_t e = 0; e < d; ++e) out[e] = rnd<T>(out[e]);
    }
  });

  // h1 = hidden + o_proj(attn); h2 = h1 + down(silu(gate(n)) * up(n)), n = post norm(h1).
  std::vector<float> o(B * H), h1(B * H);
  linear<T>(attn, B, s.o.data_ptr<T>(), H, nh * d, o.data());
  for (int64_t i = 0; i < B * H; ++i) h1[i] = rnd<T>(hid[i] + o[i]);
  std::vector<float> n1(B * H), gate(B * I), up(B * I);
  rms_norm<T>(h1.data(), B, H, H, s.post_norm.data_ptr<T>(), eps, n1.data());
  linear<T>(n1, B, s.gate.data_ptr<T>(), I, H, gate.data());
  linear<T>(n1, B, s.up.data_ptr<T>(), I, H, up.data());
  for (int64_t i = 0; i < B * I; ++i) {
    const float g = gate[i];
    gate[i] = rnd<T>(rnd<T>(g / (1.0f + std::exp(-g))) * up[i]);
  }
  std::vector<float> down(B * H);
  linear<T>(gate, B, s.down.data_ptr<T>(), H, I, down.data());
  at::Tensor hidden_out = at::empty({B, H}, s.embeds.options());
  T* ho = hidden_out.data_ptr<T>();
  std::vector<float> h2(B * H);
  for (int64_t i = 0; i < B * H; ++i) {
    h2[i] = rnd<T>(h1[i] + down[i]);
    ho[i] = static_cast<T>(h2[i]);
  }

  // logits = lm_head(norm(h2)) in T; log_softmax in fp32; top-k mapped through d2t.
  std::vector<float> f(B * H), logits(B * N);
  rms_norm<T>(h2.data(), B, H, H, s.norm.data_ptr<T>(), eps, f.data());
  linear<T>(f, B, s.lm_head.data_ptr<T>(), N, H, logits.data());
  const int64_t K = s.topk;
  at::Tensor ids = at::empty({B, K}, s.embeds.options().dtype(at::kLong));
  at::Tensor logp = at::empty({B, K}, s.embeds.options().dtype(at::kFloat));
  const int64_t* d2t = s.d2t.data_ptr<int64_t>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> order(N);
    for (int64_t b = b0; b < b1; ++b) {
      const float* l = logits.data() + b * N;
      const float m = *std::max_element(l, l + N);
      float sum = 0;
      for (int64_t j = 0; j < N; ++j) sum += std::exp(l[j] - m);
      const float lse = std::log(sum);
      std::iota(order.begin(), order.end(), 0);
      // NaN ranks as -inf (as the CUDA kernels rank it): compared raw it is neither above nor below any
      // value, which is no strict weak ordering, and std::partial_sort's behaviour is then undefined.
      const auto key = [l](int64_t a) { return std::isnan(l[a]) ? -INFINITY : l[a]; };
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&key](int64_t a, int64_t c) {
        return key(a) > key(c) || (key(a) == key(c) && a < c);
      });
      for (int64_t j = 0; j < K; ++j) {
        const int64_t id = order[j];
        ids.data_ptr<int64_t>()[b * K + j] = id + d2t[id];
        logp.data_ptr<float>()[b * K + j] = (l[id] - m) - lse;
      }
    }
  });
  return {hidden_out, ids, logp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> draft_step_cpu(
    const at::Tensor& embeds, const at::Tensor& hidden, const at::Tensor& positions, at::Tensor& k_cache,
    at::Tensor& v_cache, const at::Tensor& cache_lens, const std::optional<at::Tensor>& fc_weight,
    const at::Tensor& input_norm_weight, const at::Tensor& hidden_norm_weight, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& v_weight, const at::Tensor& o_weight,
    const at::Tensor& post_norm_weight, const at::Tensor& gate_weight, const at::Tensor& up_weight,
    const at::Tensor& down_weight, const at::Tensor& norm_weight, const at::Tensor& lm_head_weight,
    const at::Tensor& d2t, double eps, const at::Tensor& rope_inv_freq, int64_t topk) {
  const DraftStep s = make_draft_step(embeds, hidden, positions, k_cache, v_cache, cache_lens, fc_weight,
                                      input_norm_weight, hidden_norm_weight, q_weight, k_weight, v_weight,
                                      o_weight, post_norm_weight, gate_weight, up_weight, down_weight,
                                      norm_weight, lm_head_weight, d2t, eps, rope_inv_freq, topk);
  switch (s.dtype) {
    case at::kFloat:
      return run<float>(s);
    case at::kBFloat16:
      return run<c10::BFloat16>(s);
    default:
      return run<c10::Half>(s);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(drafter_lab, CPU, m) {
  m.impl("draft_step", &draft_step_cpu);
}

}  // namespace drafter_lab::draft_forward
