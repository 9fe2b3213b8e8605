"""Packages a run's options need are named before the data or the model loads (``integration/prerequisites.py``),
with the one ``pip install`` that adds them; a run whose packages are there goes on."""

import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import tomllib
import yaml
from repo_paths import REPO

from llamafactory_zebra.integration import prerequisites
from llamafactory_zebra.integration.prerequisites import PREDICT, PREREQUISITES, check_prerequisites

METRICS = ("jieba", "nltk", "rouge_chinese")


def _only_these_missing(monkeypatch, missing, present=()):
    """``find_spec`` as if ``missing`` were not installed and ``present`` were; other names as they are."""
    find_spec = importlib.util.find_spec

    def fake(name, package=None):
        if name in missing:
            return None
        if name in present:
            return importlib.machinery.ModuleSpec(name, None)
        return find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", fake)


def _predict_args(tiny_model_dir, tmp_path, **more):
    return {
        "model_name_or_path": str(tiny_model_dir),
        "stage": "sft",
        "do_predict": True,
        "predict_with_generate": True,
        "finetuning_type": "full",
        "eval_dataset": "zebra_demo",
        "dataset_dir": str(REPO / "examples" / "data"),
        "template": "zebra",
        "cutoff_len": 64,
        "max_samples": 2,
        "output_dir": str(tmp_path / "out"),
        "report_to": "none",
        **more,
    }


def test_the_metrics_extra_installs_what_predict_with_generate_needs():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    extra = pyproject["project"]["optional-dependencies"]["metrics"]
    assert extra == [row.pip for row in PREREQUISITES if row.option == PREDICT]
    assert [row.module for row in PREREQUISITES if row.option == PREDICT] == list(METRICS)


def test_a_predict_run_without_jieba_is_refused_before_anything_loads(monkeypatch, tiny_model_dir, tmp_path):
    """In the parser (LLaMA-Factory's own check would name one distribution per run, as a PackageNotFoundError)."""
    from llamafactory.hparams import get_train_args

    _only_these_missing(monkeypatch, {"jieba"}, present={"nltk", "rouge_chinese"})
    with pytest.raises(ValueError) as refused:
        get_train_args(_predict_args(tiny_model_dir, tmp_path))
    message = str(refused.value)
    assert "- predict_with_generate: true needs jieba\n" in message
    assert message.endswith("Install them: pip install jieba")

    _only_these_missing(monkeypatch, set(METRICS))
    with pytest.raises(ValueError, match=r"needs jieba, nltk, rouge_chinese\nInstall them: pip install jieba nltk "
                                         r"rouge-chinese$"):  # fmt: skip
        get_train_args(_predict_args(tiny_model_dir, tmp_path))


def test_a_run_with_its_packages_goes_on(monkeypatch, tiny_model_dir, tmp_path):
    """Stand-ins for the metrics packages (a module and its distribution's metadata, as pip leaves them) let the
    plugin's check and LLaMA-Factory's own pass; nothing here runs the metrics."""
    from llamafactory.hparams import get_train_args

    site = tmp_path / "site"
    for module, distribution in (("jieba", "jieba"), ("nltk", "nltk"), ("rouge_chinese", "rouge_chinese")):
        (site / module).mkdir(parents=True)
        (site / module / "__init__.py").write_text("")
        (site / f"{distribution}-1.0.dist-info").mkdir()
        (site / f"{distribution}-1.0.dist-info" / "METADATA").write_text(f"Name: {distribution}\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    model, _, training, *_ = get_train_args(_predict_args(tiny_model_dir, tmp_path))
    assert training.predict_with_generate and prerequisites.missing_prerequisites(model, training) == []


def test_loggers_and_quantization_backends_are_named_too(monkeypatch):
    _only_these_missing(monkeypatch, {"wandb", "tensorboard", "hqq"})
    model = SimpleNamespace(quantization_bit=4, quantization_method="hqq")
    training = SimpleNamespace(predict_with_generate=False, report_to=["wandb", "tensorboard"])
    with pytest.raises(ValueError) as refused:
        check_prerequisites(model, training)
    assert str(refused.value).splitlines()[1:] == [
        "- report_to: wandb needs wandb",
        "- report_to: tensorboard needs tensorboard",
        "- quantization_bit with quantization_method: hqq needs hqq",
        "Install them: pip install wandb tensorboard hqq",
    ]
    # Inference (``chat``, ``export``: no training arguments) checks the quantisation backend only.
    with pytest.raises(ValueError, match="quantization_method: hqq needs hqq"):
        check_prerequisites(model, None)
    check_prerequisites(SimpleNamespace(quantization_bit=None, quantization_method="hqq"), None)


@pytest.mark.slow
def test_llamafactory_cli_refuses_a_predict_run_without_jieba(tiny_model_dir, tmp_path):
    """The CLI in a fresh process where ``jieba`` cannot be found (a ``sitecustomize`` hides it, whether or not it is
    installed): refused in the parser, before the dataset or the model loads."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import importlib.util\n"
        "_find_spec = importlib.util.find_spec\n"
        "def find_spec(name, package=None):\n"
        "    return None if name == 'jieba' else _find_spec(name, package)\n"
        "importlib.util.find_spec = find_spec\n"
    )
    config = tmp_path / "predict.yaml"
    config.write_text(yaml.safe_dump(_predict_args(tiny_model_dir, tmp_path)))
    path = os.pathsep.join([str(shim), str(REPO), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "llamafactory-cli"), "train", str(config)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "- predict_with_generate: true needs jieba" in output, output[-3000:]
    assert "Install them: pip install jieba" in output
    assert "Loading dataset" not in output and "trainable params" not in output
