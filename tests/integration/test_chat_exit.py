"""A Zebra model's streaming generation thread is joined at exit (``integration/chat_exit.py``).

The subprocess test is the failure itself, made deterministic: the main thread returns while the
engine's generation thread is still inside torch. As a daemon that thread is ended mid-call at
shutdown and the process aborts (exit 134, ``terminate called without an active exception``); joined,
the process exits 0 after the last token. A daemon that happens to be in Python code when the
interpreter finalises exits quietly instead, and one still inside torch when the process ends is
killed with it (both exit 0): so the script's first forward hook tells the main thread to return and
keeps the generation thread in short torch calls for seconds, one of which returns while the
interpreter finalises.
"""

import importlib
import subprocess
import sys
import textwrap

import pytest

from llamafactory_zebra import seam
from llamafactory_zebra.integration import seams

# The engine's own Thread name, started the way LLaMA-Factory's _stream_chat starts it, then the
# interpreter exits at once.
EXIT_DURING_GENERATION = textwrap.dedent(
    """
    import sys, threading, torch
    from llamafactory.chat import hf_engine
    from llamafactory_zebra import seam
    from llamafactory_zebra.integration import seams
    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer
    from transformers import AutoModelForCausalLM

    if sys.argv[1] == "joined":
        seams.install(hf_engine)
    if sys.argv[1] == "stock" and seam.is_wrapped(hf_engine, "Thread"):
        seam.unwrap(hf_engine, "Thread")
    model = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
    inside_torch = threading.Event()

    def hold_inside_torch(module, args, output):
        handle.remove()
        inside_torch.set()
        square = torch.eye(600)
        for _ in range(300):  # a few seconds of short torch calls, the GIL released in each
            square = square @ square

    handle = model.register_forward_hook(hold_inside_torch)
    prompt = torch.tensor([[1, 2, 3]])
    kwargs = dict(inputs=prompt, max_new_tokens=400, min_new_tokens=400, do_sample=False)
    hf_engine.Thread(target=model.generate, kwargs=kwargs, daemon=True).start()
    inside_torch.wait()
    print("main thread returns", flush=True)
    """
)


def _engine_module():
    hf_engine = importlib.import_module("llamafactory.chat.hf_engine")
    installed_here = not seam.is_wrapped(hf_engine, "Thread")
    seams.install(hf_engine)
    return hf_engine, installed_here


def test_only_a_zebra_generate_thread_stops_being_a_daemon(tiny_model_dir):
    from distill_helpers import tiny_qwen3
    from transformers import AutoModelForCausalLM

    zebra = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    qwen3 = tiny_qwen3(vocab_size=32, num_hidden_layers=1)
    hf_engine, installed_here = _engine_module()
    try:
        assert not hf_engine.Thread(target=zebra.generate, daemon=True).daemon
        assert hf_engine.Thread(target=qwen3.generate, daemon=True).daemon
        assert hf_engine.Thread(target=print, daemon=True).daemon
    finally:
        if installed_here:
            seam.unwrap(hf_engine, "Thread")


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "exit_code"), [("stock", -6), ("joined", 0)])
def test_exit_while_generating_aborts_as_a_daemon_and_exits_0_when_joined(tiny_model_dir, mode, exit_code):
    result = subprocess.run(
        [sys.executable, "-c", EXIT_DURING_GENERATION, mode, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "main thread returns" in result.stdout, result.stderr[-2000:]
    assert result.returncode == exit_code, result.stderr[-2000:]
    if mode == "stock":
        assert "terminate called without an active exception" in result.stderr
