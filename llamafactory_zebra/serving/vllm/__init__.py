"""vLLM model plugin for Zebra checkpoints (MLA + Gated DeltaNet hybrids): ``vllm serve DIR`` / ``vllm.LLM(DIR)``.

How it plugs in: ``pyproject.toml`` declares the ``vllm.general_plugins`` entry point ``zebra`` →
:func:`register`, which vLLM calls in every process it starts. Importing it imports ``llamafactory_zebra``,
which registers ``ZebraConfig`` with transformers' ``AutoConfig`` (native checkpoints: ``model_type:
zebra``); :func:`register` installs the config parser
that reads AMD's released layout (Qwen3 ``config.json`` + ``hybrid_config.json``; why a parser under
the name ``hf``: ``config_parser.py``), and registers the architecture ``ZebraForCausalLM`` with vLLM's
``ModelRegistry`` (lazily, by module path). No flag and no ``trust_remote_code`` is needed.

What runs where (``model.py``, ``mla.py``, ``gdn.py``):
- MLA layers: by default the latent cache (``latent_mla.py``: the transformers decode cache's row per token,
  the plugin's own cache layer, backend and metadata builder, absorbed decode; vLLM's MLA kernels take a
  576-wide latent only); with ``VLLM_MLA_DISABLE=1`` or LoRA enabled, expanded keys/values in vLLM's paged
  ``Attention`` (``mla.py``'s ``cache_layout``). ``arch_config.py`` tells vLLM the expanded layout's head size.
- GDN layers: vLLM's state slots (``MambaBase``), this project's conv / gated-delta-rule ops on them
  (PyTorch on CPU, fla's kernels on GPU — GPU not verified).
- Verified on CPU (``tests_vllm/``, vLLM CPU 0.32): fp32 log-probs of every prompt and generated token
  equal the transformers model's (released head shapes at small width, 1-300-token prompts, chunked
  prefill, a batch of mixed lengths = each prompt alone; every ``mla_norm``, both RoPE conventions, YaRN
  with and without DeepSeek's mscale, ``q_lora_rank: null``, attention biases); bf16 within a small
  multiple of transformers-bf16's own error, on the released layout and a native checkpoint. The measured
  errors: docs/benchmarks.md, "vLLM log-probs against the transformers model". Eager and the default
  ``torch.compile`` mode. Broken checkpoints are refused naming the key.
- LoRA adapters (``--enable-lora``, ``lora.py``): every linear layer, packed ones through
  ``packed_modules_mapping``; vLLM's CPU LoRA ops fixed for requests without an adapter (``seams.py``).
- Not supported (refused at load, naming the option): tensor/pipeline parallelism, speculative decoding,
  ``rope_type: dynamic``, activations other than SiLU.
- Prefix caching: vLLM's default for hybrids (on, GDN states in its ``align`` mode) with no setting from
  this plugin: the scheduler ends prompt chunks at block borders and vLLM's runner copies a cached block's
  state into the request's slot (``ZebraForCausalLM.get_mamba_state_copy_func``), so the GDN layer's
  read-the-slot, write-the-slot recurrence is all align mode needs (``tests_vllm/test_prefix_caching.py``);
  ``seams.py`` gives the scheduler back the block size vLLM's CPU platform resets after start-up, so
  prompts are not cut into needless chunks.
- AMX CPUs: vLLM's CPU attention runs AMX instructions without asking Linux for the tile state; every
  process the plugin loads in asks first (``amx.py``), so no worker dies with SIGILL.
"""

from __future__ import annotations


def register() -> None:
    """vLLM's ``general_plugins`` hook: the Zebra config in both layouts and the model class."""
    from vllm import ModelRegistry

    from .amx import request_amx_tiles
    from .arch_config import register_arch_config_convertor
    from .config_parser import ARCHITECTURE
    from .seams import install as install_vllm_seams

    request_amx_tiles()  # before any vLLM kernel runs in this process (amx.py)
    install_vllm_seams()  # the fixes and the released layout's config parser (seams.py)
    register_arch_config_convertor()  # the head size vLLM sizes hybrid blocks by (arch_config.py)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "llamafactory_zebra.serving.vllm.model:ZebraForCausalLM")
