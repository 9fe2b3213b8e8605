#!/usr/bin/env bash
# The quickstart, continued: serve saves/zebra-tiny-sft (written by scripts/quickstart.sh) with vLLM's
# OpenAI-compatible server and ask it the held-out question through /v1/chat/completions.
# Usage (from the repository root, after scripts/quickstart.sh):  bash scripts/serve_quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-saves/zebra-tiny-sft}
PORT=${PORT:-8000}
if [ ! -f "$MODEL/config.json" ]; then
  echo "error: $MODEL/config.json not found: run bash scripts/quickstart.sh first (it trains $MODEL)" >&2
  exit 1
fi
bash scripts/vllm_env.sh
# The C++ CPU kernels for the vLLM venv's torch (once per install, a few minutes), before the server starts.
.venv-vllm/bin/llamafactory-zebra build-kernels || echo "warning: no C++ CPU kernels; serving runs their slower PyTorch paths" >&2

# Loopback only; a small CPU cache (GiB) is plenty for the tiny model. --dtype float32: the model was
# trained in fp32 (examples/quickstart_cpu.yaml), and vLLM's "auto" would serve an fp32 checkpoint in bf16
# on CPU.
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} HF_HUB_OFFLINE=1 \
  .venv-vllm/bin/vllm serve "$MODEL" --host 127.0.0.1 --port "$PORT" --max-model-len 512 --dtype float32 \
  >saves/vllm-serve.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT

echo "vllm serve $MODEL (PID $server, log saves/vllm-serve.log): waiting for http://127.0.0.1:$PORT/health"
for _ in $(seq 600); do
  if curl --silent --fail "http://127.0.0.1:$PORT/health" >/dev/null; then
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    tail -30 saves/vllm-serve.log >&2
    echo "error: vllm serve exited; see saves/vllm-serve.log" >&2
    exit 1
  fi
  sleep 1
done

echo "POST /v1/chat/completions: Write 47 in words."
curl --silent --fail --max-time 120 "http://127.0.0.1:$PORT/v1/chat/completions" \
  -H "Content-Type: application/json" \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Write 47 in words.\"}],
       \"max_tokens\": 16, \"temperature\": 0, \"chat_template_kwargs\": {\"enable_thinking\": false}}" |
  .venv-vllm/bin/python -c 'import json, sys; print("answer:", json.load(sys.stdin)["choices"][0]["message"]["content"].strip())'
