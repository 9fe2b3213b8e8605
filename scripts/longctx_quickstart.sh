#!/usr/bin/env bash
# Long-context quickstart on CPU: a random tiny Zebra (preset tiny-16k: 16K positions, 1 MLA : 3 GDN layers),
# passkey SFT rows written offline (none of them an eval-long sample), eval-long before training, two staged
# `llamafactory-cli train` calls (short samples; then samples of 512-4K and 4K-8K tokens, packed into 8,192-token
# rows with neat_packing), eval-long after, the before/after table, both depth heatmaps, the learning curve
# (passkey at 2K and 8K against training tokens, every checkpoint) and the loss plots.
# Usage (from the repository root):  bash scripts/longctx_quickstart.sh
# Smaller runs (the test's miniature): SHORT_ROWS, SHORT_LENGTHS, MID_ROWS, MID_LENGTHS, LONG_ROWS, LONG_LENGTHS,
# EVAL_LENGTHS, EVAL_SAMPLES, EVAL_TASKS, CURVE_LENGTHS, CURVE_SAMPLES, and TRAIN_ARGS (LLaMA-Factory key=value
# overrides for both stages, e.g. max_steps=2).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e .
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

# Training runs PyTorch's paths; the package's C++ CPU kernels serve inference, and eval-long's short answers
# took the same time without them (docs/benchmarks.md), so this script does not spend minutes building them.
export ZEBRA_CPU_KERNELS=${ZEBRA_CPU_KERNELS:-torch}
OUT=saves/longctx                  # the YAMLs in examples/longctx/ read and write here
SHORT_ROWS=${SHORT_ROWS:-45000}
SHORT_LENGTHS=${SHORT_LENGTHS:-100-300}
MID_ROWS=${MID_ROWS:-600}
MID_LENGTHS=${MID_LENGTHS:-512-4096}
LONG_ROWS=${LONG_ROWS:-150}
LONG_LENGTHS=${LONG_LENGTHS:-4096-8192}
EVAL_LENGTHS=${EVAL_LENGTHS:-1k,2k,4k,8k,16k}
EVAL_SAMPLES=${EVAL_SAMPLES:-6}
EVAL_TASKS=${EVAL_TASKS:-passkey,niah_single,niah_multikey}
CURVE_LENGTHS=${CURVE_LENGTHS:-2k,8k}
CURVE_SAMPLES=${CURVE_SAMPLES:-6}
read -r -a TRAIN_OVERRIDES <<< "${TRAIN_ARGS:-}"
started=$(date +%s)

llamafactory-zebra init tiny-16k "$OUT/zebra-init" --overwrite
llamafactory-zebra data passkey-sft --model "$OUT/zebra-init" --output-dir "$OUT/data" \
  --name passkey_short --rows "$SHORT_ROWS" --lengths "$SHORT_LENGTHS" --instruction-share 0.3 --seed 1
llamafactory-zebra data passkey-sft --model "$OUT/zebra-init" --output-dir "$OUT/data" \
  --name passkey_mid --rows "$MID_ROWS" --lengths "$MID_LENGTHS" --seed 2
llamafactory-zebra data passkey-sft --model "$OUT/zebra-init" --output-dir "$OUT/data" \
  --name passkey_long --rows "$LONG_ROWS" --lengths "$LONG_LENGTHS" --seed 3

eval_long() {  # eval_long INFER_YAML OUTPUT_DIR
  # Answers are a number (passkey) or a 7-digit value (niah); an untrained model never stops by itself, so the
  # budget is capped. One sample at a time: a left-padded batch of 8K prompts took 12.7 GB.
  llamafactory-zebra eval-long run "$1" --tasks "$EVAL_TASKS" --lengths "$EVAL_LENGTHS" --samples "$EVAL_SAMPLES" \
    --depths 3 --max-new-tokens 16 --output-dir "$2"
}

echo; echo "eval-long before training:"
eval_long examples/longctx/infer_init.yaml "$OUT/eval_before"
llamafactory-cli train examples/longctx/stage1_short_cpu.yaml "${TRAIN_OVERRIDES[@]}"
llamafactory-cli train examples/longctx/stage2_long_cpu.yaml "${TRAIN_OVERRIDES[@]}"
echo; echo "eval-long after training:"
eval_long examples/longctx/infer_trained.yaml "$OUT/eval_after"
echo; echo "passkey against training tokens (every checkpoint of both stages):"
llamafactory-zebra eval-long curve examples/longctx/infer_init.yaml --stages "$OUT/zebra-stage1" "$OUT/zebra-stage2" \
  --tasks passkey --lengths "$CURVE_LENGTHS" --samples "$CURVE_SAMPLES" --label zebra --output-dir "$OUT/curve"

echo
echo "Before -> after (percent; eval-long's seed 42, $EVAL_SAMPLES samples per cell):"
llamafactory-zebra eval-long compare before="$OUT/eval_before" after="$OUT/eval_after"
echo
echo "Depth heatmaps: $OUT/eval_before/  $OUT/eval_after/  (depth_heatmap.png: the depth tasks together;"
echo "                depth_heatmap_TASK.png: each alone, e.g. depth_heatmap_passkey.png)"
echo "Learning curve: $OUT/curve/curve.png"
echo "Loss plots:     $OUT/zebra-stage1/training_loss.png  $OUT/zebra-stage2/training_loss.png"
echo "Wall time:      $(( $(date +%s) - started )) s"
