"""Serving engines for Zebra checkpoints (``vllm``: the vLLM model plugin).

Nothing here imports LLaMA-Factory: serving runs in its own environment (vLLM pins a transformers that
LLaMA-Factory 0.9.5 does not accept; ``scripts/vllm_env.sh``).
"""
