"""How many training tokens does a random ``tiny-16k`` Zebra need before it copies a value out of its context?

Why it exists: each ``llamafactory-cli train`` run of the long-context quickstart (``scripts/longctx_quickstart.sh``)
costs minutes of start-up and packing, too slow to search a recipe with. This probe trains the same model on
the same kind of rows in a plain PyTorch loop (short samples packed into rows with restarting ``position_ids``,
loss on the answers only or ``--dense-loss``, AdamW, warm-up then cosine) and, every ``--eval-every`` steps,
scores eval-long's own samples of ``--eval-task`` (``niah_single`` or ``passkey``; its noise haystack, its
wording) teacher-forced: the share of the value's digits whose greedy prediction is right, and the share of
samples with all digits right. ``--schedule`` runs a curriculum (sample lengths and row kind by stage).

Three kinds of training rows:

- ``niah``: :mod:`llamafactory_zebra.data.retrieval_sft` rows, eval-long's wording (needle "One of the special
  magic numbers for KEY is: VALUE.", answer "The special magic number for KEY mentioned in the provided text
  is VALUE.");
- ``secret``: "The secret word is VALUE." among a few filler sentences, asked back; ``--answer-prefix`` sets the
  words the answer puts before the value. With the needle's own words ("The secret word is") the value follows
  the same tokens in needle and answer, a copy an induction head makes; with other words the model has to
  find the value from words the needle does not hold, which is what eval-long's ``niah`` asks;
- ``passkey``: :mod:`llamafactory_zebra.data.passkey_sft` rows (the quickstart's), ``--instruction-share`` of them
  opening with the papers' instruction.

    python benchmarks/probe_retrieval_learning.py --rows passkey --instruction-share 0.3 --lengths 100-300 \
        --steps 3000 --lr 1e-3 --eval-task passkey --eval-every 250 --eval-lengths 300,1024 --eval-samples 8
    python benchmarks/probe_retrieval_learning.py --rows niah --needles 1-1 --lengths 160-240
    python benchmarks/probe_retrieval_learning.py --rows secret --value number
    python benchmarks/probe_retrieval_learning.py --rows secret --value number --answer-prefix "The number you asked for is"
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch


def span(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="saves/longctx/zebra-init", help="an init'ed model (config, tokenizer)")
    parser.add_argument("--rows", choices=("niah", "secret", "passkey"), default="niah")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--row-tokens", type=int, default=2048, help="packed row length")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--lengths", type=span, default=(160, 240), help="niah, passkey: tokens per sample")
    parser.add_argument(
        "--schedule",
        default="",
        help="curriculum: STEPS:LOW-HIGH[:ROWS],... (sample lengths and row kind by stage; overrides --lengths)",
    )
    parser.add_argument("--instruction-share", type=float, default=1.0, help="passkey: rows with the instruction")
    parser.add_argument("--dense-loss", action="store_true", help="loss on every token, not the answers only")
    parser.add_argument("--eval-task", choices=("niah_single", "passkey"), default="niah_single")
    parser.add_argument("--needles", type=span, default=(1, 1), help="niah: needles per sample")
    parser.add_argument("--questions", type=int, default=1, help="niah: questions per sample")
    parser.add_argument("--filler-numbers", type=float, default=0.0, help="niah: share of filler with a number")
    parser.add_argument(
        "--value", choices=("word", "number"), default="word", help="secret: a pseudo-word or 7 digits"
    )
    parser.add_argument("--answer-prefix", default="The secret word is", help="secret: the answer's words")
    parser.add_argument("--filler-sentences", type=int, default=2, help="secret: at most this many on each side")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-lengths", type=lambda text: [int(n) for n in text.split(",")], default=[512, 2048])
    parser.add_argument("--eval-samples", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoConfig, AutoTokenizer

    from llamafactory_zebra import ZebraForCausalLM
    from llamafactory_zebra.data import passkey_sft, retrieval_sft
    from llamafactory_zebra.data.cutoff import row_tokens
    from llamafactory_zebra.evaluation import tasks
    from llamafactory_zebra.evaluation.haystack import noise_haystack

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    chat = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="zebra", enable_thinking=False))
    model = ZebraForCausalLM(AutoConfig.from_pretrained(args.model))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def measure(messages: list[dict[str, str]]) -> int:
        return row_tokens(chat, tokenizer, messages)

    options = retrieval_sft.RetrievalOptions(
        needles=args.needles,
        questions=args.questions,
        multivalue_share=0.0,
        tracking_share=0.0,
        filler_number_share=args.filler_numbers,
    )
    filler = retrieval_sft.filler_haystack(1, options, encode)
    rng = random.Random(1)

    def secret_row(row_rng: random.Random) -> list[dict[str, str]]:
        def sentences() -> str:
            count = row_rng.randint(0, args.filler_sentences)
            return " ".join(retrieval_sft.filler_sentence(row_rng, 0.0) for _ in range(count))

        if args.value == "number":
            value = str(row_rng.randrange(10**6, 10**7))
        else:
            value = retrieval_sft.key_name(row_rng, (3, 3))
        context = f"{sentences()} The secret word is {value}. {sentences()}"
        return [
            {"role": "user", "content": f"{context}\n\nWhat is the secret word?"},
            {"role": "assistant", "content": f"{args.answer_prefix} {value}."},
        ]

    stages = [
        (int(steps), span(lengths), kind[0] if kind else args.rows)
        for steps, lengths, *kind in (part.split(":") for part in args.schedule.split(",") if part)
    ]
    if stages:
        args.steps = sum(steps for steps, _, _ in stages)
    passkey_options = passkey_sft.PasskeyOptions(instruction_share=args.instruction_share)
    passkey_haystacks = (noise_haystack(encode), filler)
    current = {"step": 0}

    def stage() -> tuple[tuple[int, int], str]:
        done = 0
        for steps, lengths, kind in stages:
            done += steps
            if current["step"] < done:
                return lengths, kind
        return (stages[-1][1], stages[-1][2]) if stages else (args.lengths, args.rows)

    def sample() -> tuple[list[int], list[int]]:
        row_rng = random.Random(rng.random())
        lengths, kind = stage()
        length = row_rng.randint(*lengths)
        if kind == "secret":
            messages = secret_row(row_rng)
        elif kind == "passkey":
            haystack = passkey_haystacks[row_rng.random() < passkey_options.other_filler_share]
            messages = passkey_sft.make_passkey_row(row_rng, length, haystack, measure, passkey_options)
        else:
            messages = retrieval_sft.make_row(row_rng, length, filler, measure, options)
        ids, labels = [], []
        for prompt, answer in chat.encode_multiturn(tokenizer, messages):
            ids += prompt + answer
            labels += (prompt if args.dense_loss else [-100] * len(prompt)) + answer
        return ids, [-100] + labels[1:]  # a sample's first token is never predicted from the previous sample

    def packed_row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, labels, positions = [], [], []
        while not ids or len(ids) + len(next_sample[0]) <= args.row_tokens:
            ids += next_sample[0]
            labels += next_sample[1]
            positions += range(len(next_sample[0]))
            next_sample[:] = sample()
        return torch.tensor([ids]), torch.tensor([labels]), torch.tensor([positions])

    haystack = noise_haystack(encode)

    def eval_measure(item: tasks.Sample) -> int:
        prefix = [{"role": "user", "content": item.prompt}, {"role": "assistant", "content": item.answer_prefix}]
        return measure(prefix)

    @torch.no_grad()
    def score(length: int) -> tuple[float, float]:
        model.eval()
        right = digits = whole = 0
        for index in range(args.eval_samples):
            depth = (index + 0.5) / args.eval_samples
            item = tasks.TASKS[args.eval_task](length, index, depth, random.Random(f"eval/{index}"), haystack,
                                               eval_measure, tasks.TaskOptions())  # fmt: skip
            reply = f"{item.answer_prefix} {item.answers[0]}."
            ((prompt, answer),) = chat.encode_multiturn(
                tokenizer, [{"role": "user", "content": item.prompt}, {"role": "assistant", "content": reply}]
            )
            predicted = model(input_ids=torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1].argmax(-1)
            checks = [
                int(predicted[i]) == token for i, token in enumerate(answer) if tokenizer.decode([token]).isdigit()
            ]
            right, digits, whole = right + sum(checks), digits + len(checks), whole + all(checks)
        model.train()
        return right / digits, whole / args.eval_samples

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def schedule(step: int) -> float:
        return min(1.0, (step + 1) / 10) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step, args.steps) / args.steps)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    next_sample = list(sample())
    print(f"{'step':>6} {'tokens':>10} {'seconds':>8} {'loss':>7}  niah_single digits / whole values, by length")
    started, tokens, losses = time.perf_counter(), 0, []
    for step in range(1, args.steps + 1):
        current["step"] = step
        ids, labels, positions = packed_row()
        loss = model(input_ids=ids, labels=labels, position_ids=positions).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        tokens, losses = tokens + ids.numel(), losses + [loss.item()]
        if step % args.eval_every == 0 or step == args.steps:
            scores = "  ".join(f"{n}: {d:.2f} / {w:.2f}" for n, (d, w) in ((n, score(n)) for n in args.eval_lengths))
            mean = sum(losses) / len(losses)
            print(f"{step:>6} {tokens:>10} {time.perf_counter() - started:>8.0f} {mean:>7.3f}  {scores}", flush=True)
            losses = []
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
