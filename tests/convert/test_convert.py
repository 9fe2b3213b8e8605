"""``llamafactory-zebra convert``: a Qwen3 checkpoint built here becomes a Zebra hybrid.

Checked against plain references computed in the test: the base's own logits, the singular values of
the base matrices (Eckart–Young), the base tensors the GDN projections copy, and the bytes the model's
cache really holds. The slow tests train the converted model through ``llamafactory-cli``, chat with
it, and run the sensitivity selection (the base model once per layer).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from repo_paths import REPO
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3ForCausalLM

from llamafactory_zebra.convert import ConversionInputError, ConversionOptions, convert_checkpoint, uniform_mla_layers
from llamafactory_zebra.convert.hybrid_plan import resolve_dims
from llamafactory_zebra.convert.mla_init import head_dim_order
from llamafactory_zebra.convert.source import base_shape

DEMO = REPO / "examples" / "data" / "zebra_demo.json"
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, LAYERS = 4, 2, 32, 64, 4
ROPE = HEAD_DIM // 2


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Small SVDs on a busy 2-core machine spend seconds in OpenMP spin-waits with more than one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def qwen3_base(path: Path, tokenizer=None, edit=None, shard_size="48KB", **overrides) -> Path:
    """A random Qwen3 (q/k norms with non-trivial weights, GQA, tied embeddings) saved in several shards."""
    values = dict(
        vocab_size=len(tokenizer) if tokenizer is not None else 97,
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    values.update(overrides)
    torch.manual_seed(11)
    model = Qwen3ForCausalLM(Qwen3Config(**values)).float()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.15)
        if edit is not None:
            edit(model)
    model.save_pretrained(path, max_shard_size=shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def load_all(path: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            tensors.update({key: handle.get_tensor(key) for key in handle.keys()})
    return tensors


def per_head(weight, heads):
    return weight.view(heads, -1, weight.shape[-1])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return qwen3_base(tmp_path_factory.mktemp("qwen3") / "base")


@pytest.fixture(scope="module")
def base_tensors(base_dir):
    return load_all(base_dir)


@pytest.fixture(scope="module")
def full_rank_all_mla(base_dir, tmp_path_factory):
    options = ConversionOptions(num_mla=LAYERS, allow_single_kind=True, q_lora_rank=HIDDEN, kv_lora_rank=HIDDEN)
    return convert_checkpoint(base_dir, tmp_path_factory.mktemp("out") / "mla", options, progress=False)


def test_rope_dims_are_the_base_pairs_turning_at_the_mla_frequencies():
    order = head_dim_order(HEAD_DIM, ROPE, interleave=True).tolist()
    assert sorted(order) == list(range(HEAD_DIM))
    rope = order[HEAD_DIM - ROPE :]
    # MLA pair i = (2i, 2i+1) rotates at theta^(-2i/ROPE) = theta^(-2j/HEAD_DIM) for base pair j = 2i.
    assert [(rope[2 * i], rope[2 * i + 1]) for i in range(ROPE // 2)] == [
        (2 * i, 2 * i + HEAD_DIM // 2) for i in range(ROPE // 2)
    ]
    half_split = head_dim_order(HEAD_DIM, ROPE, interleave=False).tolist()[HEAD_DIM - ROPE :]
    assert half_split == [2 * i for i in range(ROPE // 2)] + [2 * i + HEAD_DIM // 2 for i in range(ROPE // 2)]


def test_full_rank_mla_reproduces_every_projection_product(full_rank_all_mla, base_tensors):
    out = load_all(full_rank_all_mla.output)
    config = full_rank_all_mla.config
    nope = config.qk_nope_head_dim
    order = head_dim_order(HEAD_DIM, ROPE, interleave=config.rope_interleave)
    for i in range(LAYERS):
        src, dst = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mla."
        q = per_head(base_tensors[src + "q_proj.weight"], HEADS)[:, order].reshape(-1, HIDDEN)
        torch.testing.assert_close(
            out[dst + "q_b_proj.weight"] @ out[dst + "q_a_proj.weight"], q, atol=1e-5, rtol=1e-5
        )
        k = per_head(base_tensors[src + "k_proj.weight"], KV_HEADS)[:, order]
        v = per_head(base_tensors[src + "v_proj.weight"], KV_HEADS)
        kv_a = out[dst + "kv_a_proj_with_mqa.weight"]
        product = (out[dst + "kv_b_proj.weight"] @ kv_a[: config.kv_lora_rank]).view(KV_HEADS, -1, HIDDEN)
        torch.testing.assert_close(product[:, :nope], k[:, :nope], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(product[:, nope:], v, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv_a[config.kv_lora_rank :], k[:, nope:].mean(0), atol=1e-6, rtol=1e-6)
        assert torch.equal(out[dst + "out_proj.weight"], base_tensors[src + "o_proj.weight"])
        for norm in ("q_norm", "k_norm"):
            assert torch.equal(out[dst + f"{norm}.weight"], base_tensors[src + f"{norm}.weight"][order])
        for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            key = f"model.layers.{i}.{name}.weight"
            assert torch.equal(out[key], base_tensors[key])
    assert torch.equal(out["lm_head.weight"], base_tensors["model.embed_tokens.weight"])  # tied base, untied copy


def representable_by_mla(model):
    """Make the two things MLA cannot represent vanish: the query dims that become nope (the odd rotary
    pairs, i.e. the odd dims here) carry nothing, and both KV heads have the same rope rows (even dims)."""
    for layer in model.model.layers:
        per_head(layer.self_attn.q_proj.weight, HEADS)[:, 1::2] = 0.0
        keys = per_head(layer.self_attn.k_proj.weight, KV_HEADS)
        keys[1:, 0::2] = keys[0, 0::2]


def test_full_rank_all_mla_gives_the_base_logits_where_mla_can_represent_the_base(tmp_path):
    from llamafactory_zebra import ZebraForCausalLM

    base_path = qwen3_base(tmp_path / "base", edit=representable_by_mla)
    options = ConversionOptions(num_mla=LAYERS, allow_single_kind=True, q_lora_rank=HIDDEN, kv_lora_rank=HIDDEN)
    result = convert_checkpoint(base_path, tmp_path / "mla", options, progress=False)
    assert all(row.rope_key_spread < 1e-6 for row in result.report.layers)
    base = Qwen3ForCausalLM.from_pretrained(base_path, attn_implementation="eager").eval()
    zebra = ZebraForCausalLM.from_pretrained(result.output, attn_implementation="eager").eval()
    tokens = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        expected, logits = base(tokens).logits, zebra(tokens).logits
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)
    # Without the edit the same conversion is only an approximation (what distillation then repairs).
    approximate = ZebraForCausalLM.from_pretrained(
        convert_checkpoint(qwen3_base(tmp_path / "plain"), tmp_path / "plain-mla", options, progress=False).output
    ).eval()
    plain = Qwen3ForCausalLM.from_pretrained(tmp_path / "plain").eval()
    with torch.no_grad():
        assert (approximate(tokens).logits - plain(tokens).logits).abs().max() > 1e-2


def test_reduced_ranks_lose_exactly_the_discarded_singular_value_energy(base_dir, base_tensors, tmp_path):
    q_rank, kv_rank = 20, 12
    options = ConversionOptions(mla_layers=[0, 2], q_lora_rank=q_rank, kv_lora_rank=kv_rank)
    result = convert_checkpoint(base_dir, tmp_path / "low", options, progress=False)
    out = load_all(tmp_path / "low")
    order = head_dim_order(HEAD_DIM, ROPE, interleave=result.config.rope_interleave)
    for row in result.report.layers:
        if row.kind != "mla":
            continue
        src, dst = f"model.layers.{row.layer}.self_attn.", f"model.layers.{row.layer}.mla."
        q = base_tensors[src + "q_proj.weight"].double()
        sigma = torch.linalg.svdvals(q)
        discarded = (sigma[q_rank:].square().sum() / sigma.square().sum()).sqrt()
        written = (out[dst + "q_b_proj.weight"] @ out[dst + "q_a_proj.weight"]).double()
        permuted = per_head(q, HEADS)[:, order].reshape(-1, HIDDEN)
        measured = torch.linalg.matrix_norm(permuted - written) / torch.linalg.matrix_norm(q)
        assert float(measured) == pytest.approx(float(discarded), rel=1e-4)
        assert row.q_relative_error == pytest.approx(float(discarded), rel=1e-4)
        assert row.q_energy_kept == pytest.approx(1 - float(discarded) ** 2, abs=1e-6)
        # [K nope rows; V] per KV head: the nope rows are the odd base dims (every other rotary pair is rope).
        k = per_head(base_tensors[src + "k_proj.weight"].double(), KV_HEADS)[:, 1::2]
        v = per_head(base_tensors[src + "v_proj.weight"].double(), KV_HEADS)
        sigma = torch.linalg.svdvals(torch.cat((k, v), dim=1).flatten(0, 1))
        discarded = (sigma[kv_rank:].square().sum() / sigma.square().sum()).sqrt()
        assert row.kv_relative_error == pytest.approx(float(discarded), rel=1e-4)
        assert row.kv_energy_kept == pytest.approx(1 - float(discarded) ** 2, abs=1e-6)


def test_gdn_projections_are_bit_exact_copies_of_the_attention_blocks(base_dir, base_tensors, tmp_path):
    result = convert_checkpoint(
        base_dir, tmp_path / "gdn", ConversionOptions(mla_layers=[1], gdn_head_dim=96), progress=False
    )
    config, out = result.config, load_all(tmp_path / "gdn")
    key_dim, value_dim = config.gdn_num_heads * config.gdn_head_dim, config.gdn_num_heads * config.gdn_head_v_dim
    attention_dim = HEADS * HEAD_DIM
    assert key_dim < attention_dim < value_dim  # both overlap directions are exercised
    group = HEADS // KV_HEADS
    for i in config.gdn_layers:
        src, dst = f"model.layers.{i}.self_attn.", f"model.layers.{i}.gdn."
        k = per_head(base_tensors[src + "k_proj.weight"], KV_HEADS).repeat_interleave(group, 0).reshape(-1, HIDDEN)
        v = per_head(base_tensors[src + "v_proj.weight"], KV_HEADS).repeat_interleave(group, 0).reshape(-1, HIDDEN)
        assert torch.equal(out[dst + "q_proj.weight"], base_tensors[src + "q_proj.weight"][:key_dim])
        assert torch.equal(out[dst + "k_proj.weight"], k[:key_dim])
        assert torch.equal(out[dst + "v_proj.weight"][:attention_dim], v)
        assert torch.equal(out[dst + "o_proj.weight"][:, :attention_dim], base_tensors[src + "o_proj.weight"])
        fresh = out[dst + "v_proj.weight"][attention_dim:]
        assert 0.01 < float(fresh.std()) < 0.03  # the rows the base does not cover: N(0, 0.02), not zeros or copies
        assert torch.equal(
            out[f"model.layers.{i}.mlp.down_proj.weight"], base_tensors[f"model.layers.{i}.mlp.down_proj.weight"]
        )
    report = json.loads((tmp_path / "gdn" / "conversion_report.json").read_text())
    assert report["layers"][0]["copied"]["q_proj.weight"] == f"rows 0..{key_dim} of {key_dim}"


def test_uniform_plan_and_default_dims_reproduce_the_released_qwen3_1_7b_layout():
    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
    from llamafactory_zebra.convert.hybrid_plan import layer_types_from
    from llamafactory_zebra.convert.pipeline import zebra_config_for

    assert uniform_mla_layers(28, 7) == [1, 5, 9, 13, 17, 21, 25]
    assert uniform_mla_layers(28, 14) == list(range(0, 28, 2))
    assert uniform_mla_layers(5, 5) == [0, 1, 2, 3, 4]
    qwen3_1_7b = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "rope_theta": 1000000, "torch_dtype": "bfloat16",
    }  # fmt: skip
    shape = base_shape(qwen3_1_7b, "Qwen3-1.7B")
    dims = resolve_dims(ConversionOptions(), shape)
    released = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-8k")
    for field in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  "gdn_num_heads", "gdn_head_dim", "gdn_expand_v", "gdn_conv_size"):  # fmt: skip
        assert getattr(dims, field) == getattr(released, field), field
    config = zebra_config_for(shape, qwen3_1_7b, dims, layer_types_from(uniform_mla_layers(28, 7), 28))
    assert config.layer_types == released.layer_types
    assert (config.mla_norm, config.rope_interleave) == (released.mla_norm, released.rope_interleave)
    with torch.device("meta"):
        assert sum(p.numel() for p in ZebraForCausalLM(config).parameters()) == 2_284_173_820  # published count


def test_report_cache_bytes_match_what_the_converted_model_caches(full_rank_all_mla, base_dir):
    from llamafactory_zebra import ZebraForCausalLM

    model = ZebraForCausalLM.from_pretrained(full_rank_all_mla.output).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 97, (1, 5)), use_cache=True).past_key_values
    report = full_rank_all_mla.report
    assert report.kv_bytes_per_token == cache.bytes_per_token()
    assert report.base_kv_bytes_per_token == LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
    assert report.base_params == sum(p.numel() for p in Qwen3ForCausalLM.from_pretrained(base_dir).parameters())
    assert report.params == sum(p.numel() for p in model.parameters())


def test_llama_base_converts_without_mla_norms_and_loads_strictly(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from llamafactory_zebra import ZebraForCausalLM

    config = LlamaConfig(vocab_size=97, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rope_theta=500000.0)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    result = convert_checkpoint(tmp_path / "llama", tmp_path / "zebra", ConversionOptions(num_mla=1), progress=False)
    assert result.report.base_family == "llama"
    assert result.config.rope_parameters["rope_theta"] == 500000.0
    assert result.config.mla_norm == "none"
    model = ZebraForCausalLM.from_pretrained(result.output)  # strict: every weight present, none unexpected
    assert not any("q_norm" in name or "k_norm" in name for name, _ in model.named_parameters())


def _break_config(key, value):
    def edit(path):
        config = json.loads((path / "config.json").read_text())
        config[key] = value
        (path / "config.json").write_text(json.dumps(config))

    return edit


def _drop_tensor(name):
    def edit(path):
        from safetensors.torch import save_file

        for file in path.glob("*.safetensors"):
            with safe_open(str(file), framework="pt") as handle:
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
            if name in tensors:
                del tensors[name]
                save_file(tensors, str(file), metadata={"format": "pt"})
        (path / "model.safetensors.index.json").unlink()

    return edit


@pytest.mark.parametrize(
    "edit, options, message",
    [
        (
            _break_config("architectures", ["MistralForCausalLM"]),
            {},
            "Qwen3ForCausalLM (model_type 'qwen3'), LlamaForCausalLM",
        ),
        (None, {"q_lora_rank": HIDDEN + 1}, f"--q-lora-rank {HIDDEN + 1}: must be between 1 and {HIDDEN}"),
        (None, {"kv_lora_rank": 10_000}, "--kv-lora-rank 10000: must be between 1 and"),
        (None, {"mla_layers": [1, LAYERS]}, f"indices [{LAYERS}] are out of range; the base has {LAYERS} layers"),
        (None, {"num_mla": LAYERS}, "the layer plan has no GDN layers"),
        (None, {"plan": f"0mla{LAYERS}gdn"}, "the layer plan has no MLA layers"),
        (None, {"plan": "7mla21gdn"}, f"but the base has {LAYERS}"),
        (
            _drop_tensor("model.layers.2.self_attn.k_proj.weight"),
            {},
            "missing (1): model.layers.2.self_attn.k_proj.weight",
        ),
    ],
    ids=["architecture", "q-rank", "kv-rank", "layer-index", "no-gdn", "no-mla", "plan-size", "missing-weight"],
)
def test_bad_input_is_refused_before_anything_is_written(base_dir, tmp_path, edit, options, message):
    import shutil

    base = base_dir
    if edit is not None:
        base = tmp_path / "base"
        shutil.copytree(base_dir, base)
        edit(base)
    output = tmp_path / "out"
    with pytest.raises(ConversionInputError) as error:
        convert_checkpoint(base, output, ConversionOptions(**options), progress=False)
    assert message in str(error.value)
    assert not output.exists()


def test_cli_reports_bad_input_with_exit_code_2(base_dir, tmp_path, capsys):
    from llamafactory_zebra.cli.main import main

    assert main(["convert", str(base_dir), str(tmp_path / "out"), "--mla-layers", "0,9"]) == 2
    assert "indices [9] are out of range" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def start_training(args: dict, tmp_path: Path) -> subprocess.Popen:
    config = tmp_path / f"{args['finetuning_type']}.yaml"
    config.write_text(yaml.safe_dump(args))
    return subprocess.Popen(
        ["llamafactory-cli", "train", str(config)],
        cwd=tmp_path,
        env={**os.environ, "DISABLE_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def logged_losses(run: subprocess.Popen, output_dir: str) -> list[float]:
    log, _ = run.communicate(timeout=600)
    assert run.returncode == 0, log[-6000:]
    lines = (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()
    return [entry["loss"] for entry in map(json.loads, lines) if "loss" in entry]


@pytest.mark.slow
def test_converted_qwen3_trains_full_and_lora_then_chats(tiny_tokenizer, tmp_path):
    base = qwen3_base(tmp_path / "qwen3", tokenizer=tiny_tokenizer)
    zebra = convert_checkpoint(base, tmp_path / "zebra", ConversionOptions(mla_layers=[1, 3]), progress=False).output
    common = {
        "model_name_or_path": str(zebra),
        "stage": "sft",
        "do_train": True,
        "dataset": "zebra_demo",
        "dataset_dir": str(DEMO.parent),
        "template": "qwen3",
        "cutoff_len": 96,
        "max_samples": 8,
        "per_device_train_batch_size": 2,
        "max_steps": 3,
        "logging_steps": 1,
        "learning_rate": 1.0e-2,
        "lr_scheduler_type": "constant",
        "save_strategy": "no",
        "report_to": "none",
        "preprocessing_num_workers": 1,
        "dataloader_num_workers": 0,
        "overwrite_cache": True,
        "overwrite_output_dir": True,
        "bf16": False,
    }
    # Both runs at once: each is mostly process start-up, and CI has two cores.
    full = {"finetuning_type": "full", "output_dir": str(tmp_path / "full")}
    lora = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "output_dir": str(tmp_path / "lora")}
    runs = [(start_training({**common, **args}, tmp_path), args["output_dir"]) for args in (full, lora)]
    full, adapted = (logged_losses(run, output_dir) for run, output_dir in runs)
    for losses in (full, adapted):
        assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
        assert losses[-1] < losses[0]
    targets = set(json.loads((tmp_path / "lora" / "adapter_config.json").read_text())["target_modules"])
    assert {"q_a_proj", "kv_b_proj", "out_proj", "q_proj", "g_proj"} <= targets

    from llamafactory.chat import ChatModel

    chat = ChatModel(
        {"model_name_or_path": str(tmp_path / "full"), "template": "qwen3", "infer_backend": "huggingface",
         "max_new_tokens": 6, "do_sample": False}
    )  # fmt: skip
    responses = chat.chat([{"role": "user", "content": "What is 2 + 2?"}])
    assert type(chat.engine.model).__name__ == "ZebraForCausalLM"
    assert responses[0].response_length >= 1


@pytest.mark.slow
def test_sensitivity_puts_mla_where_replacing_attention_moves_the_output_most(tiny_tokenizer, tmp_path):
    def make_layer_2_matter(model):
        for index, layer in enumerate(model.model.layers):
            layer.self_attn.o_proj.weight.mul_(2.0 if index == 2 else 0.05)

    base = qwen3_base(tmp_path / "qwen3", tokenizer=tiny_tokenizer, edit=make_layer_2_matter)
    options = ConversionOptions(num_mla=1, select="sensitivity", data=str(DEMO), score_tokens=64)
    result = convert_checkpoint(base, tmp_path / "zebra", options, progress=False, log=lambda _: None)
    scores = {
        int(k): v for k, v in json.loads((tmp_path / "zebra" / "layer_scores.json").read_text())["scores"].items()
    }
    assert sorted(scores) == [0, 1, 2, 3] and all(score > 0 for score in scores.values())
    assert max(scores, key=scores.get) == 2
    assert result.config.mla_layers == [2]
