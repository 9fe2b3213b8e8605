#!/usr/bin/env bash
# CPU quickstart: venv + install, a tiny random Zebra model, SFT through llamafactory-cli, one chat turn.
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
echo "One chat turn with the trained model:"
printf 'What is 12 + 7?\nexit\n' | llamafactory-cli chat examples/quickstart_chat.yaml
