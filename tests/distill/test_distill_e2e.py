"""Distillation through ``llamafactory-cli train``: a tiny Qwen3 teacher trained here on the demo task, a
tiny Zebra student; ILD then KD (one process, and two ZeRO-3 ranks) must bring the student's held-out
KL to the teacher down by a stated factor and its held-out loss down, and KD alone must do the first for
LoRA and freeze students too. Bad settings fail at parse time."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from distill_helpers import tiny_qwen3, zebra_student_like
from llamafactory_cli import BASE_ARGS, run_cli, two_ranks
from repo_paths import REPO

pytestmark = pytest.mark.slow

TRAIN_SAMPLES = 96  # zebra_demo has 120: the last 24 are held out
# The shipped ZeRO-3 preset, unmodified: its bf16 "auto" follows the YAML's bf16: false on CPU.
ZERO3_PRESET = REPO / "deepspeed_configs" / "ds_z3_bf16.json"
KL_DROP_FACTOR = 3.0


def stage_args(model_dir, out, **extra):
    return {
        **BASE_ARGS,
        "model_name_or_path": str(model_dir),
        "finetuning_type": "full",
        "output_dir": str(out),
        "max_samples": TRAIN_SAMPLES,
        "max_steps": 12,
        "plot_loss": True,
        **extra,
    }


def demo_examples(tokenizer, rows):
    """(ids ``[1, L]``, prompt length) of zebra_demo rows, encoded by LLaMA-Factory's own template."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="zebra"))
    samples = json.loads((REPO / "examples" / "data" / "zebra_demo.json").read_text())[rows]
    examples = []
    for sample in samples:
        messages = sample["messages"]
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        prompt, response = template.encode_oneturn(tokenizer, messages[1:] if system else messages, system=system)
        examples.append((torch.tensor([prompt + response]), len(prompt)))
    return examples


def train_teacher(teacher, tokenizer, steps=40):
    """SFT of the tiny Qwen3 on the demo task's training rows (in-process: the student's runs use the CLI)."""
    examples = demo_examples(tokenizer, slice(0, TRAIN_SAMPLES))
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=5e-3)
    teacher.train()
    for step in range(steps):
        ids, prompt_length = examples[step % len(examples)]
        labels = ids.clone()
        labels[:, :prompt_length] = -100
        loss = teacher(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return teacher.eval()


def load_student(directory):
    """The student as the CLI saved it, in fp64: a whole model, or a LoRA adapter on the model it names."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = directory / "adapter_config.json"
    if not config.exists():
        return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    base = AutoModelForCausalLM.from_pretrained(
        json.loads(config.read_text())["base_model_name_or_path"], dtype=torch.float64
    )
    return PeftModel.from_pretrained(base, directory).eval()


@torch.no_grad()
def heldout_kl_and_loss(student_dir, teacher_dir):
    """Mean over held-out response tokens of KL(teacher‖student), and |student CE − teacher CE| (how far the
    student's held-out loss is from the teacher's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import llamafactory_zebra  # noqa: F401

    student = load_student(Path(student_dir))
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float64).eval()
    kl = ce = teacher_ce = tokens = 0.0
    for ids, prompt_length in demo_examples(AutoTokenizer.from_pretrained(student_dir), slice(TRAIN_SAMPLES, None)):
        log_q = student(input_ids=ids).logits[0, prompt_length - 1 : -1].log_softmax(-1)
        log_p = teacher(input_ids=ids).logits[0, prompt_length - 1 : -1].log_softmax(-1)
        kl += float((log_p.exp() * (log_p - log_q)).sum())
        ce -= float(log_q.gather(1, ids[0, prompt_length:, None]).sum())
        teacher_ce -= float(log_p.gather(1, ids[0, prompt_length:, None]).sum())
        tokens += ids.shape[1] - prompt_length
    return kl / tokens, abs(ce - teacher_ce) / tokens


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The teacher (tiny Qwen3 after SFT on the demo task through the CLI) and the initial student."""
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("distill")
    tokenizer = build_tiny_tokenizer()
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")}
    teacher = train_teacher(tiny_qwen3(vocab_size=len(tokenizer), seed=5, bos_token_id=None, **ids), tokenizer)
    teacher.save_pretrained(root / "teacher")
    tokenizer.save_pretrained(root / "teacher")
    student = zebra_student_like(teacher, seed=9, **ids)
    student.save_pretrained(root / "student")
    tokenizer.save_pretrained(root / "student")
    return root, root / "teacher", root / "student"


def ild_then_kd(root, name, teacher, student, env=None, **extra):
    ild_out, kd_out = root / f"{name}-ild", root / f"{name}-kd"
    common = {"teacher_model_name_or_path": str(teacher), **extra}
    log = run_cli("train", stage_args(student, ild_out, distill="ild", ild_loss="l2", **common), root, env=env)
    run_cli(
        "train",
        stage_args(ild_out, kd_out, distill="kd", kd_kl_weight=1.0, kd_ce_weight=0.0, learning_rate=1e-3, **common),
        root,
        env=env,
    )
    return log, ild_out, kd_out


def log_entries(output_dir):
    return [json.loads(line) for line in (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()]


def assert_falls(entries, key):
    """The mean of the last four logged values is below that of the first four (single batches are noisy)."""
    values = [entry[key] for entry in entries if key in entry]
    assert len(values) >= 8 and sum(values[-4:]) < sum(values[:4]), (key, values)


def test_ild_then_kd_single_process_lowers_heldout_kl_and_loss(models):
    root, teacher, student = models
    kl0, ce0 = heldout_kl_and_loss(student, teacher)
    log, ild_out, kd_out = ild_then_kd(root, "single", teacher, student)
    assert "distill: ild (l2) on layers all" in log and "teacher replicated on each rank" in log
    ild_log = log_entries(ild_out)
    for layer in range(4):
        assert_falls(ild_log, f"ild_loss_{layer}")
    assert (ild_out / "training_ild_loss_0.png").stat().st_size > 0
    kd_log = log_entries(kd_out)
    assert_falls(kd_log, "kd_loss")
    assert all("ce_loss" in entry for entry in kd_log if "loss" in entry)
    assert (kd_out / "training_kd_loss.png").stat().st_size > 0
    kl1, ce1 = heldout_kl_and_loss(ild_out, teacher)
    kl2, ce2 = heldout_kl_and_loss(kd_out, teacher)
    print(
        f"held-out KL {kl0:.4f} -> ILD {kl1:.4f} -> KD {kl2:.4f}; "
        f"|CE - teacher CE| {ce0:.4f} -> {ce1:.4f} -> {ce2:.4f}"
    )
    assert kl2 < kl0 / KL_DROP_FACTOR and kl2 < kl1, (kl0, kl1, kl2)
    assert ce2 < ce0, (ce0, ce1, ce2)


def test_ild_then_kd_on_two_zero3_ranks_lowers_heldout_kl_and_loss(models):
    root, teacher, student = models
    kl0, ce0 = heldout_kl_and_loss(student, teacher)
    env = two_ranks()
    extra = {"deepspeed": str(ZERO3_PRESET), "per_device_train_batch_size": 1, "ddp_timeout": 600}
    log, ild_out, kd_out = ild_then_kd(root, "zero3", teacher, student, env=env, **extra)
    for rank in (0, 1):
        assert f"llamafactory-zebra 0.1.0 active in rank {rank}" in log
    assert_falls(log_entries(ild_out), "ild_loss_1")
    assert_falls(log_entries(kd_out), "kd_loss")
    kl2, ce2 = heldout_kl_and_loss(kd_out, teacher)
    print(f"2 ranks: held-out KL {kl0:.4f} -> {kl2:.4f}; |CE - teacher CE| {ce0:.4f} -> {ce2:.4f}")
    assert kl2 < kl0 / KL_DROP_FACTOR and ce2 < ce0, (kl0, kl2, ce0, ce2)


@pytest.mark.parametrize(
    "tuning",
    [
        {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 8},
        {"finetuning_type": "freeze", "freeze_trainable_layers": 2, "freeze_trainable_modules": "all"},
    ],
    ids=["lora", "freeze"],
)
def test_kd_trains_lora_and_freeze_students(models, tuning):
    """KD through the CLI with a LoRA (adapter over all MLA/GDN projections) or freeze student: the KD loss falls
    and the held-out KL to the teacher drops by a stated factor (loaded as the CLI saved it: an adapter on the
    student, or the student with its last two layers trained)."""
    root, teacher, student = models
    out = root / f"kd-{tuning['finetuning_type']}"
    kl0, _ = heldout_kl_and_loss(student, teacher)
    run_cli("train", stage_args(student, out, distill="kd", teacher_model_name_or_path=str(teacher), **tuning), root)
    assert_falls(log_entries(out), "kd_loss")
    if tuning["finetuning_type"] == "lora":
        assert (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    kl1, _ = heldout_kl_and_loss(out, teacher)
    print(f"{tuning['finetuning_type']}: held-out KL {kl0:.4f} -> {kl1:.4f}")
    assert kl1 < kl0 / KL_DROP_FACTOR, (kl0, kl1)


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("distill-args")
    tokenizer = build_tiny_tokenizer()
    teacher = tiny_qwen3(vocab_size=len(tokenizer))
    for name, model in (("teacher", teacher), ("student", zebra_student_like(teacher))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    tiny_qwen3(vocab_size=len(tokenizer) + 8).save_pretrained(root / "other-vocab")
    return root


def parse(root, **extra):
    from llamafactory.hparams import get_train_args

    args = {
        "model_name_or_path": str(root / "student"),
        "stage": "sft",
        "do_train": True,
        "dataset": "zebra_demo",
        "dataset_dir": str(REPO / "examples" / "data"),
        "template": "zebra",
        "finetuning_type": "full",
        "output_dir": str(root / "out"),
        "overwrite_output_dir": True,
        "report_to": "none",
        "bf16": False,
        "teacher_model_name_or_path": str(root / "teacher"),
        "distill": "kd",
        **extra,
    }
    return get_train_args(args)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"teacher_model_name_or_path": "{root}/other-vocab"}, "vocab_size 431, the student .* 423"),
        ({"stage": "pt"}, "rides on stage: sft .* got stage: pt"),
        ({"teacher_model_name_or_path": "{root}/missing"}, "teacher_model_name_or_path: .*missing is not a loadable"),
        ({"kd_kl_weight": 0, "kd_ce_weight": 0.0}, r"kd_kl_weight \+ kd_ce_weight is 0"),
        ({"distill": "ild", "ild_layers": "0,7"}, r"ild_layers \[7\] out of range"),
        ({"distill": "logits"}, "distill must be one of ild, kd"),
    ],
)
def test_bad_distill_settings_fail_while_parsing_before_any_data(untrained, extra, message):
    extra = {k: v.format(root=untrained) if isinstance(v, str) else v for k, v in extra.items()}
    with pytest.raises(ValueError, match=message):
        parse(untrained, **extra)


def test_valid_settings_parse_and_the_shipped_examples_use_known_keys(untrained):
    from llamafactory_zebra.hparams import pop_zebra_arguments, zebra_arguments

    *_, finetuning_args, _ = parse(untrained, kd_temperature=2.0, kd_reverse_kl=True)
    distill = zebra_arguments(finetuning_args)
    assert distill.kd_temperature == 2.0 and distill.kd_reverse_kl
    for name, mode in (("distill_ild.yaml", "ild"), ("distill_kd.yaml", "kd")):
        rest, distill = pop_zebra_arguments(yaml.safe_load((REPO / "examples" / name).read_text()))
        assert distill.distill == mode and distill.teacher_model_name_or_path
        assert rest["stage"] == "sft" and not any(key.startswith(("kd_", "ild_")) for key in rest)
