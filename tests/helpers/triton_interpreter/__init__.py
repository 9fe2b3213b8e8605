"""Run fla's and Liger's Triton kernels on CPU tensors in Triton's interpreter (see ``docs/gpu.md``)."""
