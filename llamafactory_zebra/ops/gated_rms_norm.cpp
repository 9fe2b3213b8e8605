// The gated RMSNorm that closes a GDN layer, one pass per row: the CPU fast path of ``gated_rms_norm.py``
// (which says why it exists and holds the PyTorch reference it must equal). Bound in ``cpu_extension.cpp``.
//
// Per row of D values, in fp32 whatever the storage dtype:
//   out = x * rsqrt(mean(x^2) + eps) * weight * gate * sigmoid(gate)
// Written so that the compiler vectorises every loop: bf16 is read and rounded (to nearest even) with bit
// operations, and exp is computed inline (libm's expf would keep the loop scalar).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>

namespace {

inline float from_bits(uint32_t bits) { return __builtin_bit_cast(float, bits); }
inline uint32_t to_bits(float value) { return __builtin_bit_cast(uint32_t, value); }

inline float load(const float* p, int64_t j) { return p[j]; }
inline float load(const at::BFloat16* p, int64_t j) { return from_bits(static_cast<uint32_t>(p[j].x) << 16); }

inline void store(float* p, int64_t j, float value) { p[j] = value; }
inline void store(at::BFloat16* p, int64_t j, float value) {
  const uint32_t bits = to_bits(value);
  p[j].x = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// exp(x) for x <= 88: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its degree-6 Taylor polynomial (relative
// error below 2e-7 there), 2^n written into the exponent bits; below -87 the result is 0. n is rounded by
// adding and subtracting 1.5 * 2^23 (exact for |n| < 2^22), which vectorises where nearbyint does not.
inline float exp_inline(float x) {
  x = x > -87.0f ? x : -87.0f;  // not std::fmax: its NaN rule keeps the loop scalar
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * from_bits(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

template <typename T>
void norm_rows(const T* x, const T* gate, const float* weight, T* out, int64_t rows, int64_t dim, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* xr = x + row * dim;
      const T* gr = gate + row * dim;
      T* o = out + row * dim;
      float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
      for (int64_t j = 0; j < dim; ++j) {
        const float value = load(xr, j);
        squares += value * value;
      }
      const float inverse_rms = 1.0f / std::sqrt(squares / static_cast<float>(dim) + eps);
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const float g = load(gr, j);
        const float silu = g / (1.0f + exp_inline(-g));
        store(o, j, load(xr, j) * inverse_rms * weight[j] * silu);
      }
    }
  });
}

}  // namespace

torch::Tensor gated_rms_norm(torch::Tensor x, torch::Tensor gate, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && gate.is_contiguous() && x.sizes() == gate.sizes(),
              "x and gate must be contiguous tensors of one shape");
  TORCH_CHECK(x.scalar_type() == gate.scalar_type(), "x and gate must share one dtype");
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32 && weight.is_contiguous() && weight.numel() == dim,
              "weight must be a contiguous float32 vector of the last dimension's size");
  auto out = torch::empty_like(x);
  const float* w = weight.data_ptr<float>();
  if (x.scalar_type() == torch::kBFloat16) {
    norm_rows(x.data_ptr<at::BFloat16>(), gate.data_ptr<at::BFloat16>(), w, out.data_ptr<at::BFloat16>(), rows,
              dim, static_cast<float>(eps));
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be bfloat16 or float32");
    norm_rows(x.data_ptr<float>(), gate.data_ptr<float>(), w, out.data_ptr<float>(), rows, dim,
              static_cast<float>(eps));
  }
  return out;
}
