// One decode token of the gated delta rule per sequence, on fp32 or bf16 states that live in slots of one cache
// tensor, updated in place (computed in fp32, a bf16 state rounded once per step): the CPU fast path of
// ``fused_recurrent_gated_delta_rule_in_slots`` (``cpu_step.py`` says why it exists; ``in_slots.py::_step_in_place``
// is the PyTorch reference it must equal). Bound in ``bindings.cpp``.
//
// Per (sequence, head), with S the [K, V] state (rows of V contiguous); q and k read as they come (bf16 or
// fp32), L2-normalised when asked, q scaled, decay = exp(g):
//   pass 1 (read S once):    p = S^T k,  r = S^T q
//   d = beta (v - decay p)
//   pass 2 (S still in L2):  S <- decay S + k d^T
//   o = decay r + (k . q) d
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "cpu_values.h"

namespace {

using zebra::load;
using zebra::store;

template <typename In, typename S>
void step(S* states, int64_t slot_stride, int64_t head_stride, int64_t row_stride, const int64_t* slot_of,
          const In* qs, const In* ks, const In* vs, const float* gs, const float* betas, In* outs, int64_t seqs,
          int64_t heads, int64_t key_dim, int64_t value_dim, float scale, bool l2norm) {
  at::parallel_for(0, seqs * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kr(key_dim), qr(key_dim), p(value_dim), r(value_dim), d(value_dim);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t seq = row / heads, head = row % heads;
      S* s = states + slot_of[seq] * slot_stride + head * head_stride;
      float k_squares = 0.0f, q_squares = 0.0f;
#pragma omp simd reduction(+ : k_squares, q_squares)
      for (int64_t i = 0; i < key_dim; ++i) {
        kr[i] = load(ks + row * key_dim, i);
        qr[i] = load(qs + row * key_dim, i);
        k_squares += kr[i] * kr[i];
        q_squares += qr[i] * qr[i];
      }
      const float k_inv = l2norm ? 1.0f / std::sqrt(k_squares + 1e-6f) : 1.0f;
      const float q_inv = (l2norm ? 1.0f / std::sqrt(q_squares + 1e-6f) : 1.0f) * scale;
#pragma omp simd
      for (int64_t i = 0; i < key_dim; ++i) {
        kr[i] *= k_inv;
        qr[i] *= q_inv;
      }
      const float g = std::exp(gs[row]), b = betas[row];
      std::fill(p.begin(), p.end(), 0.0f);
      std::fill(r.begin(), r.end(), 0.0f);
      float key_query = 0.0f;
      for (int64_t i = 0; i < key_dim; ++i) {
        const S* s_row = s + i * row_stride;
        const float ki = kr[i], qi = qr[i];
        key_query += ki * qi;
#pragma omp simd
        for (int64_t j = 0; j < value_dim; ++j) {
          const float sij = load(s_row, j);
          p[j] += sij * ki;
          r[j] += sij * qi;
        }
      }
      const In* vr = vs + row * value_dim;
#pragma omp simd
      for (int64_t j = 0; j < value_dim; ++j) d[j] = b * (load(vr, j) - g * p[j]);
      for (int64_t i = 0; i < key_dim; ++i) {
        S* s_row = s + i * row_stride;
        const float ki = kr[i];
#pragma omp simd
        for (int64_t j = 0; j < value_dim; ++j) store(s_row, j, g * load(s_row, j) + ki * d[j]);
      }
      In* o = outs + row * value_dim;
#pragma omp simd
      for (int64_t j = 0; j < value_dim; ++j) store(o, j, g * r[j] + key_query * d[j]);
    }
  });
}

template <typename In>
void step_for_state(torch::Tensor& state, const int64_t* slot_of, const torch::Tensor& q, const torch::Tensor& k,
                    const torch::Tensor& v, const torch::Tensor& g, const torch::Tensor& beta, torch::Tensor& out,
                    float scale, bool l2norm) {
  const int64_t seqs = k.size(0), heads = k.size(1), key_dim = k.size(2), value_dim = v.size(2);
  const int64_t slot_stride = state.stride(0), head_stride = state.stride(1), row_stride = state.stride(2);
  const auto arguments = std::make_tuple(slot_stride, head_stride, row_stride, slot_of, q.data_ptr<In>(),
                                         k.data_ptr<In>(), v.data_ptr<In>(), g.data_ptr<float>(),
                                         beta.data_ptr<float>(), out.data_ptr<In>(), seqs, heads, key_dim,
                                         value_dim, scale, l2norm);
  if (state.scalar_type() == torch::kFloat32) {
    std::apply([&](auto... rest) { step<In, float>(state.data_ptr<float>(), rest...); }, arguments);
  } else {
    std::apply([&](auto... rest) { step<In, at::BFloat16>(state.data_ptr<at::BFloat16>(), rest...); }, arguments);
  }
}

}  // namespace

torch::Tensor gated_delta_step_in_slots(torch::Tensor state, torch::Tensor slots, torch::Tensor q,
                                        torch::Tensor k, torch::Tensor v, torch::Tensor g, torch::Tensor beta,
                                        double scale, bool l2norm) {
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.size(0) == q.size(0) &&
                  v.size(1) == q.size(1) && q.is_contiguous() && k.is_contiguous() && v.is_contiguous(),
              "q, k must be contiguous [N, H, K] tensors and v a contiguous [N, H, V] one");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == torch::kFloat32 || q.scalar_type() == torch::kBFloat16),
              "q, k, v must share one dtype, float32 or bfloat16");
  TORCH_CHECK(g.scalar_type() == torch::kFloat32 && beta.scalar_type() == torch::kFloat32 && g.is_contiguous() &&
                  beta.is_contiguous(),
              "g and beta must be contiguous float32 [N, H] tensors");
  TORCH_CHECK((state.scalar_type() == torch::kFloat32 || state.scalar_type() == torch::kBFloat16) &&
                  state.dim() == 4 && state.stride(3) == 1,
              "state must be a float32 or bfloat16 [slots, H, K, V] tensor with rows of V contiguous");
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.dim() == 1 && slots.is_contiguous(),
              "slots must be a contiguous int64 vector");
  auto out = torch::empty_like(v);
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  if (q.scalar_type() == torch::kFloat32) {
    step_for_state<float>(state, slot_of, q, k, v, g, beta, out, static_cast<float>(scale), l2norm);
  } else {
    step_for_state<at::BFloat16>(state, slot_of, q, k, v, g, beta, out, static_cast<float>(scale), l2norm);
  }
  return out;
}
