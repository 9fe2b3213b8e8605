#!/usr/bin/env bash
# CPU quickstart: venv + install, a tiny random Zebra model, SFT through llamafactory-cli on a small task
# (spell 0-99 in words), the held-out accuracy, and one chat turn.
# Usage (from the repository root):  bash scripts/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e .
# The C++ CPU kernels (CPU inference speed) are compiled once per install, a few minutes: here, as a step of
# its own, rather than inside the chat below. A machine that cannot build them runs their PyTorch paths.
llamafactory-zebra build-kernels || echo "warning: no C++ CPU kernels; inference runs their slower PyTorch paths" >&2

llamafactory-zebra init tiny saves/zebra-tiny --overwrite
llamafactory-cli train examples/quickstart_cpu.yaml
echo
echo "Loss curve: saves/zebra-tiny-sft/training_loss.png"
python - <<'PY'
import json
logs = [json.loads(line) for line in open("saves/zebra-tiny-sft/trainer_log.jsonl") if '"loss"' in line]
print(f"loss: first logged {logs[0]['loss']:.3f} -> last logged {logs[-1]['loss']:.3f}")
PY

echo
echo "Held-out numbers (never in the training data), greedy answers through LLaMA-Factory's ChatModel:"
python - <<'PY'
import json

import yaml
from llamafactory.chat import ChatModel

chat_model = ChatModel(yaml.safe_load(open("examples/quickstart_chat.yaml")))
rows = json.load(open("examples/data/quickstart_heldout.json"))
correct = 0
for row in rows:
    question, expected = row["instruction"], row["output"]
    answer = chat_model.chat([{"role": "user", "content": question}])[0].response_text.strip()
    correct += answer == expected
    print(f"  {question:<22} expected {expected:<14} model {answer:<14} {'ok' if answer == expected else 'WRONG'}")
print(f"held-out accuracy: {correct}/{len(rows)} = {correct / len(rows):.0%}")
PY

echo
echo "One chat turn with the trained model (47 is held out):"
# Piped input reads `exit` the moment the reply ends; the plugin joins the generation thread before the
# interpreter shuts down (llamafactory_zebra/integration/chat_exit.py), so this exits 0, never 134.
printf 'Write 47 in words.\nexit\n' | llamafactory-cli chat examples/quickstart_chat.yaml
