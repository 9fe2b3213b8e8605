// The gated RMSNorm that closes a GDN layer, one pass per row: the CPU fast path of ``ops/gated_rms_norm.py``
// (which says why it exists and holds the PyTorch reference it must equal). Bound in ``bindings.cpp``, wrapped
// in ``gated_rms_norm.py``.
//
// Per row of D values, in fp32 whatever the storage dtype:
//   out = x * rsqrt(mean(x^2) + eps) * weight * gate * sigmoid(gate)
// Every loop vectorises (``cpu_values.h``).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>

#include "cpu_values.h"

namespace {

using zebra::exp_inline;
using zebra::load;
using zebra::store;

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
