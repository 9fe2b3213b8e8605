"""Cache bytes vLLM allocates for Zebra (released 7 MLA + 21 GDN) vs Qwen3-1.7B, from vLLM's own spec objects.

Per token: the paged attention layers (the latent layout's spec, ``serving/vllm/latent_mla.py``, and the
expanded layout's ``FullAttentionSpec``: page bytes divided by the block size). Per sequence: the GDN layers'
fixed state (``MambaSpec`` page bytes, with the shapes of vLLM's ``MambaStateShapeCalculator`` as
``llamafactory_zebra.serving.vllm.gdn`` uses them). Then the longest
single sequence each cache budget holds. Run in the vLLM venv:

    VENV/bin/python benchmarks/bench_vllm_cache.py
"""

import torch
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.serving.vllm.arch_config import expanded_head_size
from llamafactory_zebra.serving.vllm.gdn import gdn_state_shape
from llamafactory_zebra.serving.vllm.latent_mla import latent_cache_spec

BLOCK = 16
DTYPE = torch.bfloat16
BUDGETS_GIB = (4, 16, 64)


def per_token(spec) -> float:
    return spec.page_size_bytes / spec.block_size


def main() -> None:
    zebra = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m")
    mla, gdn = len(zebra.mla_layers), len(zebra.gdn_layers)
    expanded = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=zebra.num_key_value_heads, head_size=expanded_head_size(zebra), dtype=DTYPE
    )
    latent = latent_cache_spec(BLOCK, DTYPE, zebra.mla_cache_channels)
    qwen = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, head_size_v=128, dtype=DTYPE)
    states = {
        ssm: MambaSpec(
            shapes=gdn_state_shape(zebra),
            dtypes=(DTYPE, ssm),
            block_size=1,
            mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        )
        for ssm in (torch.float32, torch.bfloat16)
    }
    rows = [
        ("Qwen3-1.7B (28 attention layers)", 28 * per_token(qwen), 0),
        ("Zebra, MLA latent (the default layout), SSM fp32", mla * per_token(latent), gdn * states[torch.float32].page_size_bytes),
        ("Zebra, MLA latent, SSM bf16", mla * per_token(latent), gdn * states[torch.bfloat16].page_size_bytes),
        ("Zebra, MLA as expanded K/V (VLLM_MLA_DISABLE=1), SSM fp32", mla * per_token(expanded), gdn * states[torch.float32].page_size_bytes),
    ]  # fmt: skip
    qwen_token = rows[0][1]
    header = "| cache layout (bf16 K/V) | bytes/token | Qwen3 bytes / these | GDN state/seq (MiB) | " + " | ".join(
        f"max tokens in {b} GiB" for b in BUDGETS_GIB
    )
    print(header + " |")
    print("|---" * (4 + len(BUDGETS_GIB)) + "|")
    for name, token_bytes, state_bytes in rows:
        fits = [max(0, int((b * 2**30 - state_bytes) // token_bytes)) for b in BUDGETS_GIB]
        print(
            f"| {name} | {token_bytes:,.0f} | {qwen_token / token_bytes:.1f}x | {state_bytes / 2**20:.1f} | "
            + " | ".join(f"{n:,}" for n in fits)
            + " |"
        )
    print(f"\nper layer: expanded MLA {per_token(expanded):,.0f} B/token, latent MLA {per_token(latent):,.0f} B/token, "
          f"Qwen3 attention {per_token(qwen):,.0f} B/token; GDN state {states[torch.float32].page_size_bytes:,} B/seq "
          f"(SSM fp32), shapes {gdn_state_shape(zebra)}")  # fmt: skip


if __name__ == "__main__":
    main()
