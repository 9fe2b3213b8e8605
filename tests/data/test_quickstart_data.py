"""The quickstart's demo task: the shipped data is what its generator writes, and held-out means unseen."""

import importlib.util
import json

from repo_paths import EXAMPLES

DATA = EXAMPLES / "data"


def _generator():
    spec = importlib.util.spec_from_file_location("quickstart_numbers", DATA / "quickstart_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_files_are_the_generators_output():
    numbers = _generator()
    train, held_out = numbers.split()
    for name, expected in (("quickstart_train.json", train), ("quickstart_heldout.json", held_out)):
        rows = json.loads((DATA / name).read_text())
        assert rows == [numbers.example(n) for n in expected]


def test_held_out_numbers_are_compound_and_never_trained_on():
    numbers = _generator()
    train, held_out = numbers.split()
    assert sorted(train + held_out) == list(range(100)) and not set(train) & set(held_out)
    assert all(21 <= n <= 99 and n % 10 for n in held_out)
    train_text = (DATA / "quickstart_train.json").read_text()
    for row in json.loads((DATA / "quickstart_heldout.json").read_text()):
        assert row["instruction"] not in train_text and f'"{row["output"]}"' not in train_text
    # every word a held-out answer is made of is taught by some training answer
    taught = {word for n in train for word in numbers.in_words(n).split("-")}
    assert all(set(numbers.in_words(n).split("-")) <= taught for n in held_out)


def test_spelling_rule_on_known_numbers():
    in_words = _generator().in_words
    assert [in_words(n) for n in (0, 7, 13, 20, 47, 90, 99)] == [
        "zero",
        "seven",
        "thirteen",
        "twenty",
        "forty-seven",
        "ninety",
        "ninety-nine",
    ]


def test_quickstart_configs_use_the_registered_splits():
    info = json.loads((DATA / "dataset_info.json").read_text())
    root = DATA.parents[1]
    assert (root / "examples" / "quickstart_cpu.yaml").read_text().count("dataset: quickstart_train") == 1
    assert "examples/data/quickstart_heldout.json" in (root / "scripts" / "quickstart.sh").read_text()
    assert info["quickstart_train"]["file_name"] == "quickstart_train.json"
    assert info["quickstart_heldout"]["file_name"] == "quickstart_heldout.json"
