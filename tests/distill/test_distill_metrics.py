"""The distillation loss parts: summed as device tensors per micro-batch, converted once per log."""

from types import SimpleNamespace

import pytest
import torch

from llamafactory_zebra.distill.metrics import MICRO_BATCHES, TOKENS, LossParts

SUM_OVER_RANKS = SimpleNamespace(reduce=lambda tensor, reduction: tensor * 2)  # two ranks with equal sums


@pytest.fixture
def no_host_copies(monkeypatch):
    """Every way a tensor reaches Python numbers raises while the micro-batches run."""

    def refuse(*args, **kwargs):
        raise AssertionError("a loss part was copied to the host during a micro-batch")

    for name in ("item", "tolist", "cpu", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    return monkeypatch


def test_kd_parts_are_token_means_over_the_window(no_host_copies):
    parts = LossParts()
    for kd, ce, tokens in ((3.0, 1.0, 4), (5.0, 2.0, 6)):
        parts.add("kd_loss", torch.tensor(kd, requires_grad=True) * 1)
        parts.add("ce_loss", torch.tensor(ce))
        parts.add(TOKENS, torch.tensor(tokens))
    assert all(not value.requires_grad and value.dtype == torch.float64 for value in parts.sums.values())
    no_host_copies.undo()
    assert parts.take(SUM_OVER_RANKS, torch.device("cpu")) == {"ce_loss": 0.3, "kd_loss": 0.8}
    assert not parts


def test_ild_parts_are_micro_batch_means_in_layer_order(no_host_copies):
    parts = LossParts()
    for step in range(4):
        for layer in (10, 2):
            parts.add(f"ild_loss_{layer}", torch.tensor(float(layer + step)))
        parts.add(MICRO_BATCHES, torch.ones(()))
    no_host_copies.undo()
    logged = parts.take(SUM_OVER_RANKS, torch.device("cpu"))
    assert logged == {"ild_loss_2": 3.5, "ild_loss_10": 11.5} and list(logged) == ["ild_loss_2", "ild_loss_10"]


def test_the_log_callback_writes_the_distillation_metrics_on_the_same_line(tmp_path):
    import json

    from llamafactory.train import callbacks

    from llamafactory_zebra.integration.seams import install

    install(callbacks, only=("LogCallback.on_log",))
    callback = callbacks.LogCallback()
    callback.thread_pool = SimpleNamespace(submit=lambda function, *args: function(*args))
    args = SimpleNamespace(should_save=True, output_dir=str(tmp_path))
    for entry in ({"loss": 2.0, "kd_loss": 0.8, "ce_loss": 0.3}, {"loss": 1.5}):
        state = SimpleNamespace(global_step=1, log_history=[entry], num_input_tokens_seen=0)
        callback.on_log(args, state, control=None)
    lines = [json.loads(line) for line in (tmp_path / "trainer_log.jsonl").read_text().splitlines()]
    assert (lines[0]["loss"], lines[0]["kd_loss"], lines[0]["ce_loss"]) == (2.0, 0.8, 0.3)
    assert lines[1]["loss"] == 1.5 and "kd_loss" not in lines[1]
    assert "_write_log" not in vars(callback)
