// Reading and writing fp32 and bf16 values in the package's C++ CPU kernels, in forms the compiler vectorises:
// bf16 is read and rounded (to nearest even) with bit operations, and exp is computed inline (libm's expf
// would keep a loop scalar).
#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace zebra {

inline float from_bits(uint32_t bits) { return __builtin_bit_cast(float, bits); }
inline uint32_t to_bits(float value) { return __builtin_bit_cast(uint32_t, value); }

inline float load(const float* p, int64_t j) { return p[j]; }
inline float load(const at::BFloat16* p, int64_t j) { return from_bits(static_cast<uint32_t>(p[j].x) << 16); }

inline void store(float* p, int64_t j, float value) { p[j] = value; }
inline void store(at::BFloat16* p, int64_t j, float value) {
  const uint32_t bits = to_bits(value);
  p[j].x = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// A value as type T holds it: rounded to bf16 for at::BFloat16, unchanged for float.
template <typename T>
inline float rounded(float value) {
  T held;
  store(&held, 0, value);
  return load(&held, 0);
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

}  // namespace zebra
