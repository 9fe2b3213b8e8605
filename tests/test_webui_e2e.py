"""LlamaBoard with the plugin, driven end to end by headless Chromium, as a user without YAML would.

``llamafactory-cli webui`` runs in a subprocess on a free localhost port with the plugin active through
its import hook. The browser picks a Zebra model from the dropdown (the template follows), points the
model path at a tiny random Zebra, picks a fixture dataset, previews the command (once with one of
the project's DeepSpeed presets), trains a few LoRA steps on the CPU, and chats with the result.

Needs Debian's ``chromium`` + ``chromium-driver`` and Selenium (``scripts/install_browser.sh``).
Without them the browser test FAILS; ``ZEBRA_SKIP_BROWSER_TESTS=1`` skips it for local work.
Screenshots go to a temporary directory, or to ``ZEBRA_WEBUI_SCREENSHOTS`` (``docs/images`` to
refresh the walkthrough in docs/webui.md).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from llamafactory.extras.misc import is_accelerator_available
from webui.browser import BrowserMissing, browser_tests_skipped, headless_chromium
from webui.llamaboard import LlamaBoard, running_llamaboard

from llamafactory_zebra.cli.init_cmd import write_random_model
from llamafactory_zebra.data.registry import registry_dataset_info
from llamafactory_zebra.integration.model_groups import MODEL_GROUPS
from llamafactory_zebra.integration.webui import LOCALHOST_IPV4, ZEBRA_MAX_CUTOFF_LEN

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "Zebra-Qwen3-1.7B-7MLA21GDN-1M-Instruct"
FIXTURE_DATASET = "zebra_webui_fixture"
PRESET = "ds_z3_bf16_offload_all"
SCREENSHOT_ENV = "ZEBRA_WEBUI_SCREENSHOTS"
TRAINING_TIMEOUT_S = 240
CHAT_TIMEOUT_S = 120
# 16 samples, batch 2: 8 optimizer steps, one loss point each. One preprocessing worker instead of the
# UI's 16: CI has two cores.
EXTRA_ARGS = '{"optim": "adamw_torch", "preprocessing_num_workers": 1}'


def _write_fixture_dataset(data_dir: Path) -> None:
    data_dir.mkdir()
    rows = [{"instruction": f"Say the number {i}.", "input": "", "output": f"The number is {i}."} for i in range(16)]
    (data_dir / f"{FIXTURE_DATASET}.json").write_text(json.dumps(rows))
    (data_dir / "dataset_info.json").write_text(
        json.dumps({FIXTURE_DATASET: {"file_name": f"{FIXTURE_DATASET}.json"}})
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the web UI runs in, with a tiny Zebra and a fixture dataset beside it."""
    root = tmp_path_factory.mktemp("llamaboard")
    write_random_model("tiny", root / "zebra-tiny")
    _write_fixture_dataset(root / "data-fixture")
    return root


@pytest.fixture(scope="module")
def board(workdir: Path) -> Iterator[LlamaBoard]:
    with running_llamaboard(workdir) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    if browser_tests_skipped():
        pytest.skip("ZEBRA_SKIP_BROWSER_TESTS=1")
    try:
        driver = headless_chromium()
    except BrowserMissing as err:
        pytest.fail(f"headless Chromium is required for the web UI test: {err}", pytrace=False)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get(SCREENSHOT_ENV)
    return Path(configured).resolve() if configured else tmp_path_factory.mktemp("screenshots")


def test_llamaboard_listens_on_loopback_only_by_default(board: LlamaBoard) -> None:
    """GRADIO_SERVER_NAME is unset in the server's environment; upstream would bind 0.0.0.0."""
    server = psutil.Process(board.pid)
    listening = [
        conn.laddr
        for process in (server, *server.children(recursive=True))
        for conn in process.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == board.port
    ]
    assert listening, f"nothing listens on port {board.port}:\n{board.log_tail()}"
    assert {address.ip for address in listening} == {LOCALHOST_IPV4}
    assert board.url == f"http://{LOCALHOST_IPV4}:{board.port}"


def _expected_sft_datasets() -> set[str]:
    """The fixture's dataset plus the recipe registry's non-ranking ones (the SFT stage lists those)."""
    recipe = {name for name, entry in registry_dataset_info().items() if not entry.get("ranking", False)}
    return {FIXTURE_DATASET, *recipe}


def _wait_for_training(page, board: LlamaBoard) -> tuple[str, int]:
    """Polls until the run ends; returns the final output text and how many loss plots were drawn."""
    plots: set[str] = set()

    def finished() -> str | None:
        for image in page.visible("//div[@data-testid='matplotlib']//img"):
            plots.add(image.get_attribute("src"))
        failed = page.visible_text_containing("Failed.")
        if failed is not None:
            pytest.fail(f"training failed in the web UI:\n{failed.text}\n--- server log ---\n{board.log_tail()}")
        done = page.visible_text_containing("Finished.")
        return done.text if done is not None else None

    return page.wait_for(finished, "training to finish", timeout=TRAINING_TIMEOUT_S), len(plots)


def _bot_reply(page) -> str | None:
    replies = page.visible("//div[@data-testid='bot']")
    return replies[-1].text.strip() if replies else None


def _settled_reply(page) -> str:
    """The last bot message once streaming has stopped changing it for a second."""
    previous, stable_since = None, time.monotonic()

    def settled() -> str | None:
        nonlocal previous, stable_since
        reply = _bot_reply(page)
        if reply != previous:
            previous, stable_since = reply, time.monotonic()
            return None
        return reply if reply and time.monotonic() - stable_since > 1.0 else None

    return page.wait_for(settled, "a reply from the trained model", timeout=CHAT_TIMEOUT_S)


def test_train_and_chat_with_zebra_from_the_browser(board: LlamaBoard, browser, screenshots: Path, workdir: Path):
    from webui.gradio_page import GradioPage  # imports Selenium, which the browser fixture has checked

    page = GradioPage(browser, board.url)
    tiny_model, data_dir = workdir / "zebra-tiny", workdir / "data-fixture"

    # 1. Model: every Zebra group is listed, and choosing one selects the zebra template.
    listed = page.options("Model name", typed="7MLA21GDN")
    assert {name for group in MODEL_GROUPS for name in group} <= set(listed)
    page.choose("Model name", MODEL_NAME)
    page.wait_for(lambda: page.chosen("Chat template") == ["zebra"], "the zebra template to be chosen")
    page.set_text("Model path", str(tiny_model))
    page.screenshot(screenshots / "webui-1-model.png")

    # 2. Data: the fixture dir's dataset and the recipe datasets are offered.
    page.set_text("Data dir", str(data_dir))
    offered = page.wait_for(
        lambda: (names := page.options("Dataset")) and FIXTURE_DATASET in names and names,
        "the fixture dataset in the dataset dropdown",
    )
    assert set(offered) == _expected_sft_datasets()
    page.choose("Dataset", FIXTURE_DATASET)
    page.set_text("Learning rate", "5e-3")
    page.set_text("Epochs", "1.0")
    page.set_text("Max samples", "16")
    page.set_number("Cutoff length", 128)
    page.set_number("Batch size", 2)
    page.set_number("Gradient accumulation", 1)
    cutoff_box = page.block("Cutoff length").find_element("css selector", "input[type=number]")
    assert cutoff_box.get_attribute("max") == str(ZEBRA_MAX_CUTOFF_LEN)
    assert page.chosen("Compute type") == (["bf16"] if is_accelerator_available() else ["fp32"])
    page.screenshot(screenshots / "webui-2-dataset.png", page.block("Dataset"))
    page.open_accordion("Extra configurations")
    page.set_number("Logging steps", 1)
    page.set_text("Extra arguments", EXTRA_ARGS)

    # 3. The project's DeepSpeed presets are offered and reach the command.
    presets = sorted(path.stem for path in (REPO / "deepspeed_configs").glob("*.json"))
    assert presets and set(presets) <= set(page.options("DeepSpeed stage"))
    page.choose("DeepSpeed stage", PRESET)
    page.click("Preview command")
    preset_arg = f"--deepspeed {REPO / 'deepspeed_configs' / PRESET}.json"
    preview = page.wait_for(lambda: page.visible_text_containing(preset_arg), f"{preset_arg!r} in the preview")
    page.screenshot(screenshots / "webui-3-deepspeed-preset.png", preview)

    # 4. The CPU run's command: no DeepSpeed, fp32, the tiny model, the zebra template, the fixture.
    page.choose("DeepSpeed stage", "none")
    page.click("Preview command")
    preview = page.wait_for(
        lambda: (
            (code := page.visible_text_containing("llamafactory-cli train"))
            and "--deepspeed" not in code.text
            and code
        ),
        "the preview without DeepSpeed",
    )
    command = preview.text
    for argument in (
        f"--model_name_or_path {tiny_model}",
        "--template zebra",
        f"--dataset_dir {data_dir}",
        f"--dataset {FIXTURE_DATASET}",
        "--finetuning_type lora",
        "--logging_steps 1",
    ):
        assert argument in command
    assert "--bf16" not in command and "--fp16" not in command
    page.screenshot(screenshots / "webui-4-preview.png", preview)

    # 5. Train; the loss plot is drawn while the run progresses.
    output_name = page.chosen("Output dir")[0]
    page.click("Start")
    final_text, plots_drawn = _wait_for_training(page, board)
    assert plots_drawn >= 1, "the loss plot never appeared"
    page.screenshot(screenshots / "webui-5-trained.png", page.visible("//div[@data-testid='matplotlib']")[0])
    output_dir = workdir / "saves" / MODEL_NAME / "lora" / output_name
    assert (output_dir / "adapter_model.safetensors").stat().st_size > 0, final_text
    assert json.loads((output_dir / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert (output_dir / "training_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    losses = [
        entry["loss"]
        for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()
        if "loss" in (entry := json.loads(line))
    ]
    assert len(losses) == 8 and all(math.isfinite(loss) for loss in losses)

    # 6. Chat with the trained adapter.
    page.open_tab("Chat")
    page.choose("Checkpoint path", output_name)
    page.click("Load model")
    page.wait_for(lambda: page.field_containing("Model loaded"), "the model to load", timeout=CHAT_TIMEOUT_S)
    assert f"Loaded adapter(s): saves/{MODEL_NAME}/lora/{output_name}" in board.log.read_text()
    page.set_number("Maximum new tokens", 16)
    query = page.wait_for(lambda: page.visible("//textarea[@placeholder='Input...']"), "the chat input")[0]
    query.send_keys("Say the number 3.")
    page.click("Submit")
    reply = _settled_reply(page)
    assert reply
    page.screenshot(screenshots / "webui-6-chat.png", page.visible("//div[@data-testid='bot']")[-1])
