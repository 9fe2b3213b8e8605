"""The vLLM side of the seam door (``serving/vllm/seams.py``): the names the plugin changes are the upstream
code its fixes were written against, they are wrapped after ``register()``, the vLLM API surface the
serving layer reads is as recorded, and the LoRA fix is right against plain code (no engine is started)."""

import importlib
import pkgutil

import pytest
import torch

from llamafactory_zebra.seam import declared, drift, original, recorded_source
from llamafactory_zebra.serving import vllm as vllm_plugin
from llamafactory_zebra.serving.vllm import lora, register, seams


@pytest.mark.parametrize("record", seams.VLLM_SEAMS, ids=lambda record: record.name)
def test_changed_upstream_is_the_code_the_fix_was_written_against(record):
    changed = drift(record)
    assert changed is None, (
        f"vLLM changed {record.name} ({record.why}): {changed}. Re-read it, check whether seams.py's change is "
        "still needed and right, then record the new value in seams.VLLM_SEAMS"
    )


@pytest.mark.parametrize("record", seams.VLLM_API, ids=lambda record: record.name)
def test_the_vllm_api_the_serving_layer_reads_is_as_recorded(record):
    changed = drift(record)
    assert changed is None, f"vLLM changed a name the serving layer reads: {changed} (seams.VLLM_API)"


@pytest.mark.parametrize("name", [m.name for m in pkgutil.iter_modules(vllm_plugin.__path__)])
def test_every_serving_module_imports(name):
    """The names the plugin imports from vLLM and no table records (``IntermediateTensors``, the model
    interfaces, ``support_torch_compile``, ...) are still there: where no engine runs (vLLM 0.33's CUDA wheel
    on a CPU machine) this is what checks them."""
    importlib.import_module(f"{vllm_plugin.__name__}.{name}")


def test_register_installs_the_wrappers_where_vllm_calls_them():
    register()
    register()  # idempotent: vLLM loads the plugin more than once per process
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu
    from vllm.lora.worker_manager import WorkerLoRAManager

    assert lora_ops.bgmv_shrink.__code__.co_name == "zebra_bgmv_shrink"
    assert punica_cpu.bgmv_shrink is lora_ops.bgmv_shrink
    assert lora_ops.bgmv_shrink.__wrapped__ is original("vllm.lora.ops.torch_ops.lora_ops", "bgmv_shrink")
    assert WorkerLoRAManager._load_adapter.__code__.co_name == "zebra_load_adapter"
    from vllm.v1.core.sched.scheduler import Scheduler

    assert Scheduler._mamba_block_aligned_split.__code__.co_name == "zebra_mamba_block_aligned_split"
    assert Scheduler._mamba_block_aligned_split.__wrapped__ is original(
        "vllm.v1.core.sched.scheduler", "Scheduler._mamba_block_aligned_split"
    )
    from vllm.transformers_utils.config import get_config_parser

    assert type(get_config_parser("hf")).__name__ == "ZebraAwareHFConfigParser"  # the table's registration


def _scheduler_view(architecture: str, block_size: int):
    """What the split wrapper reads of a scheduler: the model, the cache config and the KV cache groups."""
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec

    mamba = MambaSpec(shapes=((3, 8),), dtypes=(torch.float32,), block_size=1664, mamba_cache_mode="align")
    attention = FullAttentionSpec(block_size=1664, num_kv_heads=1, head_size=8, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["gdn"], mamba), KVCacheGroupSpec(["mla"], attention)]
    return SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(architecture=architecture)),
        cache_config=SimpleNamespace(block_size=block_size),
        kv_cache_config=SimpleNamespace(kv_cache_groups=groups),
    )


@pytest.mark.parametrize(("architecture", "expected"), [("ZebraForCausalLM", 1664), ("Qwen3NextForCausalLM", 128)])
def test_split_runs_at_the_mamba_block_size_for_zebra_only(architecture, expected):
    """The split sees the Mamba groups' block size for a Zebra model after the CPU platform reset it to
    128; another model's config is left as vLLM made it."""
    split = seams._split_at_the_mamba_block_size(lambda self, request, tokens: self.cache_config.block_size)
    scheduler = _scheduler_view(architecture, 128)
    assert split(scheduler, None, 256) == expected
    assert scheduler.cache_config.block_size == expected


def _shrink_case():
    generator = torch.Generator().manual_seed(0)
    slots, rank, width = 3, 4, 16
    stack = torch.randn(slots, 1, rank, width, generator=generator)  # vLLM's lora_a_stacked layout
    seq_lens = torch.tensor([3, 2, 4, 1])
    adapters = torch.tensor([0, -1, 2, -1])  # -1: a request without an adapter
    inputs = torch.randn(int(seq_lens.sum()), width, generator=generator)
    return stack, seq_lens, adapters, inputs


def _plain_shrink(stack, seq_lens, adapters, inputs, scale):
    """Each token times its request's A, in fp64; zero for a request without an adapter."""
    rows = []
    for token, adapter in zip(inputs.double(), torch.repeat_interleave(adapters, seq_lens), strict=True):
        a = stack[adapter, 0].double() if adapter >= 0 else torch.zeros_like(stack[0, 0], dtype=torch.float64)
        rows.append(scale * a @ token)
    return torch.stack(rows)


def test_upstream_cpu_shrink_on_requests_without_an_adapter():
    """What the wrapper is for, on vLLM's unwrapped op: 0.32's reads index -1 as the last adapter slot (the
    bug); 0.33's gives those rows zero itself (upstream's fix), so the wrapper changes nothing there."""
    version = recorded_source(declared(seams.VLLM_SEAMS, seams.LORA_OPS, "bgmv_shrink"))
    assert version in ("0.32.0", "0.33.0"), "bgmv_shrink's source is not a recorded one (the drift test says more)"
    stack, seq_lens, adapters, inputs = _shrink_case()
    shrink = original(seams.LORA_OPS, "bgmv_shrink")
    out = torch.zeros(len(inputs), stack.shape[2])
    indices = torch.repeat_interleave(adapters, seq_lens)
    shrink(inputs, stack, out, indices, 1.0)
    without = indices < 0
    last_adapter = inputs[without] @ stack[-1, 0].T
    expected = last_adapter if version == "0.32.0" else torch.zeros_like(last_adapter)
    torch.testing.assert_close(out[without], expected)
    plain = _plain_shrink(stack, seq_lens, adapters, inputs, 1.0)  # the rows with an adapter: right in both
    torch.testing.assert_close(out[~without].double(), plain[~without], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_fixed_shrink_gives_requests_without_an_adapter_nothing(path):
    register()
    from vllm.lora.ops.torch_ops import lora_ops

    stack, seq_lens, adapters, inputs = _shrink_case()
    out = torch.full((len(inputs), stack.shape[2]), float("nan"))
    if path == "prefill":  # sgmv_shrink: one index per request
        lora_ops.sgmv_shrink(inputs, stack, out, None, seq_lens, adapters, 4, 4, len(inputs), 0.5)
    else:  # bgmv_shrink: one index per token
        lora_ops.bgmv_shrink(inputs, stack, out, torch.repeat_interleave(adapters, seq_lens), 0.5)
    torch.testing.assert_close(
        out.double(), _plain_shrink(stack, seq_lens, adapters, inputs, 0.5), rtol=1e-5, atol=1e-5
    )


def test_refusal_names_adapter_reason_and_the_fix_that_applies(tmp_path):
    (tmp_path / "adapter_config.json").write_text('{"r": 8, "rank_pattern": {"q_proj": 48}}')
    rank = lora.refusal("mine", str(tmp_path), "LoRA rank 48 is greater than max_lora_rank 16", 16)
    assert rank.startswith(f"LoRA adapter 'mine' ({tmp_path}) cannot be served by the Zebra vLLM model: LoRA rank 48")
    assert "--max-lora-rank 64" in rank
    (tmp_path / "adapter_config.json").write_text('{"r": 8, "use_dora": true}')
    dora = lora.refusal("mine", str(tmp_path), "vLLM does not yet support DoRA", 16)
    assert "DoRA" in dora
    assert f"llamafactory-cli export` (model_name_or_path: BASE, adapter_name_or_path: {tmp_path}" in dora


@pytest.mark.parametrize("name", ["_is_amx_tile_supported", "_init_amx"])
def test_the_torch_calls_behind_the_amx_request_exist(name):
    """``amx.request_amx_tiles`` calls these two private torch functions with no arguments; a torch that
    renames or drops one fails here, naming it, instead of leaving AMX workers to die with SIGILL."""
    import inspect

    function = getattr(torch.cpu, name, None)
    assert callable(function), f"torch {torch.__version__} has no torch.cpu.{name}: re-read serving/vllm/amx.py"
    assert not [p for p in inspect.signature(function).parameters.values() if p.default is p.empty]


def test_register_asks_for_amx_tiles_where_the_cpu_has_them(monkeypatch):
    from llamafactory_zebra.kernels.stack import Stack
    from llamafactory_zebra.serving.vllm import amx

    calls = []
    monkeypatch.setattr(amx, "this_machine", lambda: Stack("cpu", cpu_features=frozenset({"amx_tile"})))
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: calls.append("init") or True)
    register()
    assert calls == ["init"]
    monkeypatch.setattr(amx, "this_machine", lambda: Stack("cpu", cpu_features=frozenset({"avx512_bf16"})))
    assert amx.request_amx_tiles() is False
    assert calls == ["init"]
