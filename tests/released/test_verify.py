"""``llamafactory-zebra verify`` on a tiny Zebra trained here on the shipped text: the convention it was
trained with wins by a clear margin, a config that names another convention is caught, an untrained model
is inconclusive, and a missing directory or a truncated shard is named on the last line."""

import json

import pytest
import torch

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.cli.main import main
from llamafactory_zebra.released.verify import score_conventions, verification_tokens
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

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


def _last_line(capfd):
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err
    return [line for line in captured.out.splitlines() if line.strip()][-1]


def test_a_missing_directory_is_named(tmp_path, capfd):
    missing = tmp_path / "no-such-model"
    assert main(["verify", str(missing)]) == 2
    assert _last_line(capfd) == f"llamafactory-zebra verify: {missing}: no such directory"


def _truncate(model_dir, tmp_path):
    import shutil

    copy = tmp_path / "truncated"
    shutil.copytree(model_dir, copy)
    shard = copy / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return copy, shard


def test_a_truncated_shard_is_named_on_the_last_line(tiny_model_dir, tmp_path, capfd):
    copy, shard = _truncate(tiny_model_dir, tmp_path)
    assert main(["verify", str(copy), "--dtype", "float32"]) == 2
    last = _last_line(capfd)
    assert last.startswith(f"llamafactory-zebra verify: {shard}: not a readable safetensors file (")


def test_a_config_that_fails_validation_is_the_last_line(tiny_model_dir, tmp_path, capfd):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["layers_block_type"] = ["gdn", "mla", "attention", "gdn"]
    (broken / "config.json").write_text(json.dumps(config))
    assert main(["verify", str(broken)]) == 2
    assert "ZebraConfig.layer_types: entry 2 is 'attention'" in _last_line(capfd)


def test_an_untrained_model_is_inconclusive_not_ok(tiny_model_dir, capfd):
    assert main(["verify", str(tiny_model_dir), "--max-tokens", str(TOKENS), "--dtype", "float32"]) == 3
    last = _last_line(capfd)
    assert last.startswith("INCONCLUSIVE: the best two conventions are within 1.0")
    assert "OK" not in capfd.readouterr().out


@pytest.mark.slow
def test_the_console_script_ends_with_the_file_name_of_a_truncated_shard(tiny_model_dir, tmp_path):
    """The installed command, stdout and stderr together as a terminal shows them: the last line names the file."""
    import subprocess
    import sys
    from pathlib import Path

    copy, shard = _truncate(tiny_model_dir, tmp_path)
    script = Path(sys.executable).with_name("llamafactory-zebra")  # the environment's console script
    result = subprocess.run(
        [str(script), "verify", str(copy)], capture_output=True, text=True, timeout=300, check=False
    )
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, output[-20:]
    assert "Traceback" not in result.stderr
    assert output[-1].startswith(f"llamafactory-zebra verify: {shard}: not a readable safetensors file")
