"""ILD: zero loss and gradient for an exact copy, a falling loss when trained, packed samples kept apart."""

import copy

import pytest
import torch
from distill_helpers import tiny_qwen3, zebra_student_like

from llamafactory_zebra.distill.ild import ild_layer_losses, teacher_forced, teacher_layer_states
from llamafactory_zebra.distill.teacher import teacher_inputs
from llamafactory_zebra.distill.trainer import freeze_outside_ild
from llamafactory_zebra.hparams import ZebraArguments
from llamafactory_zebra.integration.registrations import register_sinkless_flash_attention
from llamafactory_zebra.testing.models import tiny_model


def ild_loss(student, teacher, batch, kind="l2", layers=None):
    inputs, real = teacher_inputs(batch, next(teacher.parameters()).dtype, flash_attention=False)
    states = teacher_layer_states(teacher, **inputs)
    layers = list(range(len(student.model.layers))) if layers is None else layers
    with teacher_forced(student, states) as recorded:

        def head_loss(hidden, weight):
            losses = ild_layer_losses(recorded, states, layers, real, kind)
            return torch.stack(list(losses.values())).sum(), losses

        box = {}
        student(**batch, head_loss_fn=lambda h, w: box.setdefault("out", head_loss(h, w))[0])
    return box["out"]


def packed_batch(vocab, lengths=(7, 9), pad=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (1, sum(lengths) + pad), generator=g)
    segments = torch.cat(
        [torch.full((n,), i + 1) for i, n in enumerate(lengths)] + [torch.zeros(pad, dtype=torch.long)]
    )
    positions = torch.cat([torch.arange(n) for n in lengths] + [torch.arange(pad)])
    return {"input_ids": ids, "attention_mask": segments[None], "position_ids": positions[None]}


@pytest.mark.parametrize("kind", ["l2", "mse"])
def test_exact_copy_has_zero_ild_loss_and_zero_gradient(kind):
    teacher = tiny_model(vocab_size=61)  # a Zebra teacher: the student's layers can be exact copies
    student = copy.deepcopy(teacher).train()
    batch = packed_batch(61)
    total, losses = ild_loss(student, teacher, batch, kind)
    total.backward()
    assert len(losses) == len(student.model.layers) and float(total.detach()) == 0.0
    grads = [p.grad for p in student.model.layers.parameters()]
    assert all(g is not None for g in grads) and max(float(g.abs().max()) for g in grads) == 0.0


def test_perturbed_student_ild_loss_falls_when_trained():
    teacher = tiny_qwen3(vocab_size=97).eval()
    student = zebra_student_like(teacher).train()
    batch = packed_batch(97, lengths=(11, 13), pad=0)
    optimizer = torch.optim.Adam([p for layer in student.model.layers for p in layer.parameters()], lr=3e-3)
    history = []
    for _ in range(12):
        total, _ = ild_loss(student, teacher, batch)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        history.append(float(total))
    assert history[-1] < 0.75 * history[0], history


def test_packed_samples_stay_apart_in_teacher_and_student():
    teacher = tiny_qwen3(vocab_size=97).double().eval()
    student = zebra_student_like(teacher).double().eval()
    packed = packed_batch(97, lengths=(6, 9), pad=0)
    inputs, _ = teacher_inputs(packed, torch.float64, flash_attention=False)
    states = teacher_layer_states(teacher, **inputs)
    with teacher_forced(student, states) as recorded:
        student(**packed)
    start = 0
    for length in (6, 9):
        alone = {"input_ids": packed["input_ids"][:, start : start + length]}
        alone_inputs, _ = teacher_inputs(alone, torch.float64, flash_attention=False)
        alone_states = teacher_layer_states(teacher, **alone_inputs)
        with teacher_forced(student, alone_states) as alone_recorded:
            student(**alone)
        for index in range(len(student.model.layers)):
            for mine, ref in (
                (states.outputs, alone_states.outputs),
                (states.mixer_outputs, alone_states.mixer_outputs),
                (recorded.outputs, alone_recorded.outputs),
                (recorded.mixer_outputs, alone_recorded.mixer_outputs),
            ):
                torch.testing.assert_close(mine[index][:, start : start + length], ref[index], rtol=1e-9, atol=1e-9)
        start += length


def test_mixers_only_freezes_mlps_norms_and_other_layers():
    student = zebra_student_like(tiny_qwen3(vocab_size=97))
    frozen = freeze_outside_ild(student, ZebraArguments(distill="ild", ild_layers=[1, 2], ild_trainable="mixers"))
    trainable = {name for name, p in student.named_parameters() if p.requires_grad}
    assert frozen > 0 and trainable
    assert all(name.startswith(("model.layers.1.mla.", "model.layers.2.gdn.")) for name in trainable), trainable


@pytest.fixture
def sinkless_flash_attention_registered():
    from transformers.modeling_utils import AttentionInterface

    saved = dict(AttentionInterface._global_mapping)
    register_sinkless_flash_attention()
    yield
    AttentionInterface._global_mapping.clear()
    AttentionInterface._global_mapping.update(saved)


def test_flash_attention_teacher_keeps_packed_samples_apart_in_every_row(
    reference_fa2, sinkless_flash_attention_registered
):
    """FA2 teacher (reference kernel, the attention function the distillation seam registers), two packed rows
    with padding: each sample's logits equal the sdpa teacher's on that sample alone, and the kernel got
    every sample's borders."""
    sdpa = tiny_qwen3(vocab_size=97).to(torch.bfloat16).eval()
    flash = copy.deepcopy(sdpa)
    flash.config._attn_implementation = "flash_attention_2"
    rows = [packed_batch(97, lengths=(7, 9), pad=3, seed=0), packed_batch(97, lengths=(12, 5), pad=2, seed=1)]
    batch = {key: torch.cat([row[key] for row in rows]) for key in rows[0]}
    inputs, real = teacher_inputs(batch, torch.bfloat16, flash_attention=True)
    with torch.no_grad():
        logits = flash(**inputs).logits.float()
    assert reference_fa2.dense_calls == 0 and reference_fa2.varlen_calls
    assert reference_fa2.varlen_calls[0] == [0, 7, 16, 19, 31, 36, 38]
    assert torch.equal(real, batch["attention_mask"] != 0)
    for row, lengths in enumerate(((7, 9), (12, 5))):
        start = 0
        for length in lengths:
            alone = batch["input_ids"][row : row + 1, start : start + length]
            with torch.no_grad():
                reference = sdpa(input_ids=alone).logits.float()
            error = (logits[row, start : start + length] - reference[0]).abs().max() / reference.abs().max()
            assert error < 2e-2, (row, start, float(error))
            start += length
    # The check can fail: the same rows with borders from position_ids alone attend across samples.
    reference_fa2.varlen_calls.clear()
    with torch.no_grad():
        leaky = flash(input_ids=batch["input_ids"], position_ids=inputs["position_ids"]).logits.float()
    second = slice(7, 16)
    assert (leaky[0, second] - logits[0, second]).abs().max() > 0.1 * logits.abs().max()
