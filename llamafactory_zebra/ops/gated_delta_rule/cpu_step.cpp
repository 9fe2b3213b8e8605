// One decode token of the gated delta rule per sequence, on fp32 or bf16 states that live in slots of one cache
// tensor, updated in place (computed in fp32, a bf16 state rounded once per step): the CPU fast path of ``fused_recurrent_gated_delta_rule_in_slots`` (``cpu_step.py``
// says why it exists; ``in_slots.py::_step_in_place`` is the PyTorch reference it must equal). Bound in
// ``ops/cpu_extension.cpp``.
//
// Per (sequence, head), with S the [K, V] state (rows of V contiguous), q and k normalised and q scaled:
//   pass 1 (read S once):    p = S^T k,  r = S^T q
//   d = beta (v - decay p)
//   pass 2 (S still in L2):  S <- decay S + k d^T
//   o = decay r + (k . q) d
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <vector>

#include "../cpu_values.h"

namespace {

void check(const torch::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
  TORCH_CHECK(t.dim() == dims && t.is_contiguous(), name, " must be a contiguous ", dims, "-d tensor");
}

template <typename S>
void step(S* states, int64_t slot_stride, int64_t head_stride, int64_t row_stride, const int64_t* slot_of,
          const float* qs, const float* ks, const float* vs, const float* decays, const float* betas, float* outs,
          int64_t seqs, int64_t heads, int64_t key_dim, int64_t value_dim) {
  using zebra::load;
  using zebra::store;
  at::parallel_for(0, seqs * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(value_dim), r(value_dim), d(value_dim);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t seq = row / heads, head = row % heads;
      S* s = states + slot_of[seq] * slot_stride + head * head_stride;
      const float* kr = ks + row * key_dim;
      const float* qr = qs + row * key_dim;
      const float* vr = vs + row * value_dim;
      const float g = decays[row], b = betas[row];
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
#pragma omp simd
      for (int64_t j = 0; j < value_dim; ++j) d[j] = b * (vr[j] - g * p[j]);
      for (int64_t i = 0; i < key_dim; ++i) {
        S* s_row = s + i * row_stride;
        const float ki = kr[i];
#pragma omp simd
        for (int64_t j = 0; j < value_dim; ++j) store(s_row, j, g * load(s_row, j) + ki * d[j]);
      }
      float* o = outs + row * value_dim;
#pragma omp simd
      for (int64_t j = 0; j < value_dim; ++j) o[j] = g * r[j] + key_query * d[j];
    }
  });
}

}  // namespace

torch::Tensor gated_delta_step_in_slots(torch::Tensor state, torch::Tensor slots, torch::Tensor q,
                                        torch::Tensor k, torch::Tensor v, torch::Tensor decay,
                                        torch::Tensor beta) {
  check(q, "q", 3);
  check(k, "k", 3);
  check(v, "v", 3);
  check(decay, "decay", 2);
  check(beta, "beta", 2);
  TORCH_CHECK((state.scalar_type() == torch::kFloat32 || state.scalar_type() == torch::kBFloat16) &&
                  state.dim() == 4 && state.stride(3) == 1,
              "state must be a float32 or bfloat16 [slots, H, K, V] tensor with rows of V contiguous");
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.dim() == 1 && slots.is_contiguous(),
              "slots must be a contiguous int64 vector");
  const int64_t seqs = k.size(0), heads = k.size(1), key_dim = k.size(2), value_dim = v.size(2);
  auto out = torch::empty({seqs, heads, value_dim}, v.options());
  const int64_t slot_stride = state.stride(0), head_stride = state.stride(1), row_stride = state.stride(2);
  const float *qs = q.data_ptr<float>(), *ks = k.data_ptr<float>(), *vs = v.data_ptr<float>();
  const float *decays = decay.data_ptr<float>(), *betas = beta.data_ptr<float>();
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  if (state.scalar_type() == torch::kFloat32) {
    step(state.data_ptr<float>(), slot_stride, head_stride, row_stride, slot_of, qs, ks, vs, decays, betas,
         out.data_ptr<float>(), seqs, heads, key_dim, value_dim);
  } else {
    step(state.data_ptr<at::BFloat16>(), slot_stride, head_stride, row_stride, slot_of, qs, ks, vs, decays, betas,
         out.data_ptr<float>(), seqs, heads, key_dim, value_dim);
  }
  return out;
}
