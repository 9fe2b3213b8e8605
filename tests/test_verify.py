"""``llamafactory-zebra verify`` on a tiny Zebra trained here on the shipped text: the convention it was
trained with wins by a clear margin, and a config that names another convention is caught."""

import json

import pytest
import torch

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.cli.main import main
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer
from llamafactory_zebra.verification import score_conventions, verification_tokens

TOKENS = 128


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """Two MLA layers (the conventions only touch MLA) trained 60 steps under AMD's convention."""
    tokenizer = build_tiny_tokenizer()
    input_ids = verification_tokens(tokenizer, TOKENS)
    torch.manual_seed(0)
    config = ZebraConfig.from_preset(
        "tiny", vocab_size=len(tokenizer), num_hidden_layers=2, layer_types=["mla", "mla"], use_cache=False
    )
    assert (config.rope_interleave, config.mla_norm) == (True, "qk_head")
    model = ZebraForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    path = tmp_path_factory.mktemp("verify") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_trained_convention_wins_by_a_clear_margin(trained_dir, capsys):
    assert main(["verify", str(trained_dir), "--max-tokens", str(TOKENS), "--dtype", "float32"]) == 0
    assert "OK: the configured convention fits best" in capsys.readouterr().out
    model = ZebraForCausalLM.from_pretrained(trained_dir, dtype=torch.float32).eval()
    scores = score_conventions(model, verification_tokens(build_tiny_tokenizer(), TOKENS))
    assert (scores[0].convention.rope_interleave, scores[0].convention.mla_norm) == (True, "qk_head")
    assert len(scores) == 4
    assert scores[1].perplexity > 1.5 * scores[0].perplexity


def test_a_config_with_the_wrong_rope_pairing_is_named(trained_dir, tmp_path, capsys):
    import shutil

    wrong = tmp_path / "wrong"
    shutil.copytree(trained_dir, wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["rope_interleave"] = False
    (wrong / "config.json").write_text(json.dumps(config))
    assert main(["verify", str(wrong), "--max-tokens", str(TOKENS), "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "set rope_interleave: true" in out and str(wrong / "config.json") in out
