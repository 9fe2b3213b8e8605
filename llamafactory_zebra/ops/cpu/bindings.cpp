// Python bindings of the package's C++ CPU kernels (``build.py`` builds them); each kernel lives in its own
// file of this folder, and its Python wrapper in the ``.py`` file of the same name.
#include <torch/extension.h>

torch::Tensor gated_delta_step_in_slots(torch::Tensor state, torch::Tensor slots, torch::Tensor q,
                                        torch::Tensor k, torch::Tensor v, torch::Tensor g, torch::Tensor beta,
                                        double scale, bool l2norm);
torch::Tensor gated_delta_prefill_in_slots(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor g,
                                           torch::Tensor beta, torch::Tensor state, torch::Tensor slots,
                                           torch::Tensor cu_seqlens, torch::Tensor has_initial_state, double scale,
                                           bool l2norm, bool bf16_operands);
torch::Tensor gated_rms_norm(torch::Tensor x, torch::Tensor gate, torch::Tensor weight, double eps);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gated_delta_step_in_slots", &gated_delta_step_in_slots,
        "One gated-delta-rule decode token per sequence on fp32 or bf16 state slots, in place");
  m.def("gated_delta_prefill_in_slots", &gated_delta_prefill_in_slots,
        "Prompt chunks of the gated delta rule on state slots (bf16 or fp32 GEMM operands, fp32 state)");
  m.def("gated_rms_norm", &gated_rms_norm, "rmsnorm(x) * weight * silu(gate) over the last dimension");
}
