"""``vllm serve`` on a tiny Zebra: the OpenAI completions and chat endpoints answer, then the server stops.

In both dtypes: fp32 (what ``kernels/run_dtype.py`` picks on a CPU without bf16 dot products; vLLM's own CPU GDN
kernel would refuse it, the plugin's ops take it) on this machine, and bf16 on this machine described as such a
CPU (``ZEBRA_FAKE_STACK``: its packages and compiler, no bf16 instructions), where the server's log must carry
the known issue ``cpu-bf16-without-dot-products`` with its ``--dtype float32`` fix before the first request.
Each server's log names the model runner vLLM chose (``serving/vllm/runner.py``).

The server runs on 127.0.0.1 on a free port, every wait is bounded, and it is stopped by PID (with the
engine-core processes it spawned). The chat prompt vLLM renders is checked against the checkpoint
tokenizer's own chat template (Qwen3's, which LLaMA-Factory's ``zebra`` template reproduces) for both
``enable_thinking`` settings.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

VLLM = Path(sys.executable).with_name("vllm")
SERVED_NAME = "zebra-tiny"
READY_TIMEOUT_S = 400
REQUEST_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60
QUESTION = [{"role": "user", "content": "Write 47 in words."}]
EMPTY_THINK_BLOCK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def zebra_dir(tmp_path_factory) -> Path:
    """A random tiny Zebra with the offline Qwen3-style tokenizer, as ``llamafactory-zebra init tiny`` writes."""
    from llamafactory_zebra.cli.init_cmd import write_random_model

    return write_random_model("tiny", tmp_path_factory.mktemp("zebra") / "tiny")


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as error:
        return error.code, {"error": error.read().decode(errors="replace")}


def log_tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop_server(process: subprocess.Popen) -> list[psutil.Process]:
    """SIGTERM to the server and every process it started (by PID), SIGKILL after STOP_TIMEOUT_S."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for member in tree:
        try:
            member.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=STOP_TIMEOUT_S)
    for member in alive:
        member.kill()
    psutil.wait_procs(alive, timeout=STOP_TIMEOUT_S)
    process.wait(timeout=STOP_TIMEOUT_S)
    return tree


def cpu_without_bf16_dot_products() -> str:
    """This machine as ``ZEBRA_FAKE_STACK`` JSON, less its bf16 instructions."""
    from llamafactory_zebra.kernels import this_machine

    machine = this_machine()
    return json.dumps({"device": "cpu", "versions": dict(machine.versions), "compiler": machine.compiler})


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def server(request, zebra_dir, tmp_path_factory):
    """``vllm serve ZEBRA_DIR --dtype <param>`` on 127.0.0.1:<free port>; yields (base URL, Popen, log path)."""
    from llamafactory_zebra.kernels import FAKE_STACK_ENV_VAR

    port = free_loopback_port()
    log_path = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if request.param == "bfloat16":
        env[FAKE_STACK_ENV_VAR] = cpu_without_bf16_dot_products()
    command = [
        str(VLLM),
        "serve",
        str(zebra_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--dtype",
        request.param,
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode} before it was ready:\n{log_tail(log_path)}")
            try:
                if http("GET", f"{base}/health", timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not ready after {READY_TIMEOUT_S} s:\n{log_tail(log_path)}")
            time.sleep(1)
        yield base, process, log_path
    finally:
        if process.poll() is None:
            stop_server(process)


@pytest.fixture(scope="module")
def tokenizer(zebra_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(zebra_dir)


def test_models_endpoint_lists_the_served_model(server):
    base, _, _ = server
    status, body = http("GET", f"{base}/v1/models")
    assert status == 200, body
    assert [model["id"] for model in body["data"]] == [SERVED_NAME]
    assert body["data"][0]["max_model_len"] == 512


def test_completions_endpoint(server, tokenizer):
    base, _, log_path = server
    prompt = "Write 47 in words."
    status, body = http(
        "POST",
        f"{base}/v1/completions",
        {
            "model": SERVED_NAME,
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, f"{body}\n{log_tail(log_path)}"
    choice = body["choices"][0]
    assert body["usage"]["completion_tokens"] == 8
    assert body["usage"]["prompt_tokens"] == len(tokenizer(prompt)["input_ids"])
    assert choice["prompt_token_ids"] == tokenizer(prompt)["input_ids"]
    assert len(choice["token_ids"]) == 8
    # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 sequence (byte-level tokens
    # of a random model); a full decode shows it as U+FFFD.
    assert choice["text"] == tokenizer.decode(choice["token_ids"]).rstrip("\ufffd")


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_chat_completions_endpoint_renders_the_zebra_template(server, tokenizer, enable_thinking):
    base, _, log_path = server
    status, body = http(
        "POST",
        f"{base}/v1/chat/completions",
        {
            "model": SERVED_NAME,
            "messages": QUESTION,
            "max_tokens": 6,
            "temperature": 0.0,
            "ignore_eos": True,
            "chat_template_kwargs": {"enable_thinking": enable_thinking},
            "return_token_ids": True,
        },
    )
    assert status == 200, f"{body}\n{log_tail(log_path)}"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert body["usage"]["completion_tokens"] == 6
    rendered = tokenizer.decode(body["prompt_token_ids"])
    expected = tokenizer.apply_chat_template(
        QUESTION, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )
    assert rendered == expected
    # Qwen3's switch: thinking off pre-fills an empty think block; on leaves the turn open.
    if enable_thinking:
        assert rendered.endswith("<|im_start|>assistant\n")
    else:
        assert rendered.endswith("<|im_start|>assistant\n" + EMPTY_THINK_BLOCK)


def test_the_log_names_the_model_runner_and_a_bf16_run_on_a_cpu_that_emulates_it(server, request):
    """Before the first request: vLLM's runner with its reason (the one vLLM's worker logs); in bf16 on a CPU
    without bf16 dot products, the known issue with the fix; in fp32, no such warning."""
    _, _, log_path = server
    log = log_path.read_text(errors="replace")
    runner = "V2" if "Using V2 Model Runner" in log else "V1"
    assert f"llamafactory-zebra: vLLM's {runner} model runner serves the Zebra (" in log, log_tail(log_path)
    warning = "llamafactory-zebra: a bf16 run on a CPU without bf16 dot products"
    assert (warning in log) == (request.node.callspec.params["server"] == "bfloat16"), log_tail(log_path)
    if warning in log:
        assert "fix: serving: vllm serve ... --dtype float32" in log
        assert log.index(warning) < log.find("POST /v1/") or "POST /v1/" not in log


def test_server_stops_by_pid(server):
    base, process, _ = server
    tree = stop_server(process)
    assert process.returncode is not None
    assert len(tree) >= 2, "expected the API server and at least one engine-core process"
    for member in tree:
        assert not member.is_running(), member
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        http("GET", f"{base}/health", timeout=5)
