"""Fixtures shared by the test modules: built once per session, read-only for the tests that use them."""

import os
from pathlib import Path

import pytest
import torch
from reference_flash_attention import reference_fa2  # noqa: F401  (the fixture, for every module)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every Python process a test starts gets the collector settings of subprocess_gc/sitecustomize.py.
SUBPROCESS_GC = str(Path(__file__).parent / "subprocess_gc")
if SUBPROCESS_GC not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SUBPROCESS_GC, os.environ.get("PYTHONPATH")]))


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of tiny models: one thread avoids oversubscription on busy CI machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The offline test tokenizer (Qwen3's special tokens, a tiny byte-level vocabulary); read-only."""
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory, tiny_tokenizer):
    """``tiny_tokenizer``'s files only: tools that read ``model_name_or_path`` for a tokenizer."""
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Zebra and its tokenizer, as ``llamafactory-zebra init tiny`` writes them (seed 0)."""
    from llamafactory_zebra.cli.init_cmd import write_random_model

    return write_random_model("tiny", tmp_path_factory.mktemp("zebra") / "tiny")


@pytest.fixture(scope="module")
def tiny_model_dir_seed3(tmp_path_factory):
    """A random tiny Zebra and its tokenizer drawn with seed 3 (one per module), for the end-to-end runs
    through ``llamafactory-cli``; trained copies go to their own dirs."""
    from llamafactory_zebra.cli.init_cmd import write_random_model

    return write_random_model("tiny", tmp_path_factory.mktemp("zebra") / "tiny", seed=3)


@pytest.fixture(scope="session")
def dataset_seams():
    """The plugin's dataset seams (registry names, converters, row guard) installed into LLaMA-Factory."""
    from llamafactory_zebra.integration.datasets import install_dataset_seams

    install_dataset_seams()


@pytest.fixture
def no_leaked_deepspeed_state():
    """A DeepSpeed config object makes transformers believe ZeRO-3 is on (a global weakref) and
    TrainingArguments exports ACCELERATE_USE_DEEPSPEED; neither may leak into other tests."""
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    environment = dict(os.environ)
    yield
    unset_hf_deepspeed_config()
    os.environ.clear()
    os.environ.update(environment)
