// Prompt chunks of the gated delta rule on state slots, one (sequence, head) at a time: the CPU fast path of
// ``gated_delta_rule/chunk_prefill.py`` (which says why it exists and holds the PyTorch path it must agree
// with). Bound in ``bindings.cpp``, wrapped in ``cpu_prefill.py``.
//
// Per chunk of C tokens, the algebra of ``chunk.py`` (gamma the in-chunk cumsum of g, D_ij = exp(gamma_i -
// gamma_j) for j <= i, S the [K, V] state entering the chunk, q scaled):
//   A = K K^T, T = (I + strictly_lower(diag(beta) A * D))^-1     (fp32, T by forward substitution)
//   [W | U] = T [diag(beta exp(gamma)) K | diag(beta) V]         (one GEMM)
//   P = [diag(exp(gamma)) Q ; W] S,   Vn = U - P[C:]             (one GEMM)
//   O = lower(Q K^T * D) Vn + P[:C]                              (one GEMM)
//   S <- exp(gamma_C) S + (diag(exp(gamma_C - gamma)) K)^T Vn    (one GEMM)
// The four GEMMs take operands of type O (bf16 or fp32) through ATen (oneDNN: AMX or AVX-512 where the CPU
// has them); everything between them is fused into loops over data of one chunk and one head, which stays in
// cache, and the state stays in fp32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <vector>

#include "cpu_values.h"

namespace {

using zebra::exp_inline;
using zebra::load;
using zebra::rounded;
using zebra::store;

constexpr int64_t kChunk = 64;

// One (sequence, head): its tokens [begin, end) of the packed rows, its state, and the output rows.
template <typename In, typename Op>
void prefill_one(const In* q, const In* k, const In* v, const float* g, const float* beta, float* state, In* out,
                 int64_t begin, int64_t end, int64_t heads, int64_t head, int64_t key_dim, int64_t value_dim,
                 float scale, bool l2norm, at::ScalarType operand) {
  const int64_t C = kChunk, K = key_dim, V = value_dim;
  const auto op_options = at::TensorOptions().dtype(operand);
  // GEMM operands and results (type Op) and fp32 scratch, reused by every chunk.
  at::Tensor rhs = at::empty({C, K + V}, op_options);     // [beta exp(gamma) K | beta V]
  at::Tensor inverse = at::empty({C, C}, op_options);     // T
  at::Tensor wu = at::empty({C, K + V}, op_options);      // [W | U]
  at::Tensor qw = at::empty({2 * C, K}, op_options);      // [exp(gamma) Q scale ; W]
  at::Tensor state_op = at::empty({K, V}, op_options);    // S in the operand type
  at::Tensor products = at::empty({2 * C, V}, op_options);  // [Q S ; W S], then rows [C:] become Vn
  at::Tensor intra = at::empty({C, C}, op_options);       // lower(Q K^T * D) scale
  at::Tensor outputs = at::empty({C, V}, op_options);
  at::Tensor keys_t = at::empty({K, C}, op_options);      // (diag(exp(gamma_C - gamma)) K)^T
  at::Tensor update = at::empty({K, V}, op_options);
  std::vector<float> kf(C * K), qf(C * K), gram(C * C), qk(C * C), tri(C * C), gamma(C), betas(C);
  Op* rhs_p = rhs.data_ptr<Op>();
  Op* inv_p = inverse.data_ptr<Op>();
  Op* wu_p = wu.data_ptr<Op>();
  Op* qw_p = qw.data_ptr<Op>();
  Op* state_op_p = state_op.data_ptr<Op>();
  Op* prod_p = products.data_ptr<Op>();
  Op* intra_p = intra.data_ptr<Op>();
  Op* out_p = outputs.data_ptr<Op>();
  Op* keys_t_p = keys_t.data_ptr<Op>();
  const Op* update_p = update.data_ptr<Op>();

  for (int64_t first = begin; first < end; first += C) {
    const int64_t rows = std::min(C, end - first);
    // Inputs of the chunk, rows past the sequence's end zero (they leave the state untouched).
    float cumulative = 0.0f;
    for (int64_t i = 0; i < C; ++i) {
      float* kr = kf.data() + i * K;
      float* qr = qf.data() + i * K;
      if (i >= rows) {
        std::fill(kr, kr + K, 0.0f);
        std::fill(qr, qr + K, 0.0f);
        gamma[i] = cumulative;
        betas[i] = 0.0f;
        continue;
      }
      const int64_t row = (first + i) * heads + head;
      const In* ks = k + row * K;
      const In* qs = q + row * K;
      float k_squares = 0.0f, q_squares = 0.0f;
#pragma omp simd reduction(+ : k_squares, q_squares)
      for (int64_t j = 0; j < K; ++j) {
        kr[j] = load(ks, j);
        qr[j] = load(qs, j);
        k_squares += kr[j] * kr[j];
        q_squares += qr[j] * qr[j];
      }
      const float k_inv = l2norm ? 1.0f / std::sqrt(k_squares + 1e-6f) : 1.0f;
      const float q_inv = l2norm ? 1.0f / std::sqrt(q_squares + 1e-6f) : 1.0f;
      // Normalised keys and queries as the operands hold them (rounded once in bf16, as fla's l2norm writes them).
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) {
        kr[j] = rounded<Op>(kr[j] * k_inv);
        qr[j] = rounded<Op>(qr[j] * q_inv);
      }
      cumulative += g[row];
      gamma[i] = cumulative;
      betas[i] = load(beta, row);
    }
    // A = K K^T and Q K^T on and below the diagonal (fp32).
    for (int64_t i = 0; i < C; ++i) {
      const float* ki = kf.data() + i * K;
      const float* qi = qf.data() + i * K;
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = kf.data() + j * K;
        float kk = 0.0f, qkv = 0.0f;
#pragma omp simd reduction(+ : kk, qkv)
        for (int64_t d = 0; d < K; ++d) {
          kk += ki[d] * kj[d];
          qkv += qi[d] * kj[d];
        }
        gram[i * C + j] = kk;
        qk[i * C + j] = qkv;
      }
    }
    // T = (I + strict)^-1, strict_ij = beta_i A_ij D_ij (j < i): row i of T is e_i - sum_j strict_ij T_j.
    for (int64_t i = 0; i < C; ++i) {
      float* ti = tri.data() + i * C;
      std::fill(ti, ti + C, 0.0f);
      ti[i] = 1.0f;
      for (int64_t j = 0; j < i; ++j) {
        const float strict = betas[i] * gram[i * C + j] * exp_inline(gamma[i] - gamma[j]);
        const float* tj = tri.data() + j * C;
#pragma omp simd
        for (int64_t c = 0; c <= j; ++c) ti[c] -= strict * tj[c];
      }
    }
    const float last = gamma[C - 1], decay_last = exp_inline(last);
    for (int64_t i = 0; i < C; ++i) {
      const float e_gamma = exp_inline(gamma[i]);
      const float w_factor = betas[i] * e_gamma, q_factor = scale * e_gamma, tail = exp_inline(last - gamma[i]);
      const float* kr = kf.data() + i * K;
      const float* qr = qf.data() + i * K;
      Op* rhs_row = rhs_p + i * (K + V);
      Op* q_row = qw_p + i * K;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) {
        store(rhs_row, d, w_factor * kr[d]);
        store(q_row, d, q_factor * qr[d]);
      }
      for (int64_t d = 0; d < K; ++d) store(keys_t_p, d * C + i, tail * kr[d]);
      const In* vs = v + ((first + std::min(i, rows - 1)) * heads + head) * V;  // a padding row reads a real one
#pragma omp simd
      for (int64_t d = 0; d < V; ++d) store(rhs_row, K + d, betas[i] * load(vs, d));
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) {
        store(inv_p, i * C + j, tri[i * C + j]);
        store(intra_p, i * C + j, j <= i ? scale * qk[i * C + j] * exp_inline(gamma[i] - gamma[j]) : 0.0f);
      }
    }
    at::mm_out(wu, inverse, rhs);
    for (int64_t i = 0; i < C; ++i) std::copy(wu_p + i * (K + V), wu_p + i * (K + V) + K, qw_p + (C + i) * K);
#pragma omp simd
    for (int64_t d = 0; d < K * V; ++d) store(state_op_p, d, state[d]);
    at::mm_out(products, qw, state_op);
    for (int64_t i = 0; i < C; ++i) {
      const Op* u_row = wu_p + i * (K + V) + K;
      Op* vn_row = prod_p + (C + i) * V;
#pragma omp simd
      for (int64_t d = 0; d < V; ++d) store(vn_row, d, load(u_row, d) - load(vn_row, d));
    }
    const at::Tensor new_values = products.narrow(0, C, C);
    at::mm_out(outputs, intra, new_values);
    for (int64_t i = 0; i < rows; ++i) {
      In* o = out + ((first + i) * heads + head) * V;
      const Op* inter = prod_p + i * V;
      const Op* local = out_p + i * V;
#pragma omp simd
      for (int64_t d = 0; d < V; ++d) store(o, d, load(local, d) + load(inter, d));
    }
    at::mm_out(update, keys_t, new_values);
#pragma omp simd
    for (int64_t d = 0; d < K * V; ++d) state[d] = decay_last * state[d] + load(update_p, d);
  }
}

template <typename In, typename Op>
void prefill(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
             const at::Tensor& beta, at::Tensor& state, const at::Tensor& slots, const at::Tensor& cu_seqlens,
             const at::Tensor& has_initial_state, at::Tensor& out, float scale, bool l2norm) {
  const int64_t heads = q.size(1), K = q.size(2), V = v.size(2), sequences = slots.size(0);
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  const int64_t* borders = cu_seqlens.data_ptr<int64_t>();
  const bool* continuing = has_initial_state.data_ptr<bool>();
  const auto operand = std::is_same_v<Op, float> ? at::kFloat : at::kBFloat16;
  at::parallel_for(0, sequences * heads, 1, [&](int64_t task_begin, int64_t task_end) {
    std::vector<float> local(K * V);
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t sequence = task / heads, head = task % heads;
      at::Tensor slot_state = state.select(0, slot_of[sequence]).select(0, head);  // [K, V], any strides
      at::Tensor local_view = at::from_blob(local.data(), {K, V}, at::TensorOptions().dtype(at::kFloat));
      if (continuing[sequence]) {
        local_view.copy_(slot_state);
      } else {
        local_view.zero_();
      }
      prefill_one<In, Op>(q.data_ptr<In>(), k.data_ptr<In>(), v.data_ptr<In>(), g.data_ptr<float>(),
                          beta.data_ptr<float>(), local.data(), out.data_ptr<In>(), borders[sequence],
                          borders[sequence + 1], heads, head, K, V, scale, l2norm, operand);
      slot_state.copy_(local_view);
    }
  });
}

}  // namespace

torch::Tensor gated_delta_prefill_in_slots(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor g,
                                           torch::Tensor beta, torch::Tensor state, torch::Tensor slots,
                                           torch::Tensor cu_seqlens, torch::Tensor has_initial_state, double scale,
                                           bool l2norm, bool bf16_operands) {
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.size(0) == q.size(0) &&
                  v.size(1) == q.size(1),
              "q, k must be [T, H, K] and v [T, H, V]");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "q, k, v must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "q, k, v must share one dtype, float32 or bfloat16");
  TORCH_CHECK(g.scalar_type() == at::kFloat && beta.scalar_type() == at::kFloat && g.is_contiguous() &&
                  beta.is_contiguous(),
              "g and beta must be contiguous float32 [T, H]");
  TORCH_CHECK(state.scalar_type() == at::kFloat && state.dim() == 4, "state must be a float32 [slots, H, K, V] tensor");
  TORCH_CHECK(slots.scalar_type() == at::kLong && cu_seqlens.scalar_type() == at::kLong &&
                  has_initial_state.scalar_type() == at::kBool,
              "slots and cu_seqlens must be int64, has_initial_state bool");
  auto out = torch::empty_like(v);
  const float s = static_cast<float>(scale);
  if (q.scalar_type() == at::kBFloat16) {
    if (bf16_operands) {
      prefill<at::BFloat16, at::BFloat16>(q, k, v, g, beta, state, slots, cu_seqlens, has_initial_state, out, s, l2norm);
    } else {
      prefill<at::BFloat16, float>(q, k, v, g, beta, state, slots, cu_seqlens, has_initial_state, out, s, l2norm);
    }
  } else {
    TORCH_CHECK(!bf16_operands, "bf16 operands are for bf16 inputs");
    prefill<float, float>(q, k, v, g, beta, state, slots, cu_seqlens, has_initial_state, out, s, l2norm);
  }
  return out;
}
