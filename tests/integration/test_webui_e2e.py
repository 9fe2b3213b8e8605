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
from repo_paths import REPO
from webui.browser import BrowserMissing, browser_tests_skipped, headless_chromium
from webui.llamaboard import LlamaBoard, running_llamaboard

from llamafactory_zebra.cli.init_cmd import write_random_model
from llamafactory_zebra.data.registry import registry_dataset_info
from llamafactory_zebra.integration.model_groups import MODEL_GROUPS
from llamafactory_zebra.integration.webui import LOCALHOST_IPV4, ZEBRA_MAX_CUTOFF_LEN

pytestmark = pytest.mark.slow

MODEL_NAME = "Zebra-Qwen3-1.7B-7MLA21GDN-1M-Instruct"
FIXTURE_DATASET = "zebra_webui_fixture"
PRESET = "ds_z3_bf16_offload_all"
SCREENSHOT_ENV = "ZEBRA_WEBUI_SCREENSHOTS"
TRAINING_TIMEOUT_S = 240
CHAT_TIMEOUT_S = 120
# The UI draws the loss plot only while the run is alive (polled every 2 s; its final message carries no
# plot), so the run must outlast a few polls: 16 fixture samples, batch 2, 16 epochs, logged every step.
EPOCHS = 16
OPTIMIZER_STEPS = 16 // 2 * EPOCHS
# One preprocessing worker instead of the UI's 16: CI has two cores.
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
        missing = str(err)
    else:
        missing = None
    if missing is not None:
        pytest.fail(f"headless Chromium is required for the web UI test: {missing}", pytrace=False)
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


def _wait_or_show_log(page, board: LlamaBoard, probe, what: str, timeout: float | None = None):
    """``page.wait_for``, failing with the server's log: the UI shows only the start of errors."""
    try:
        return page.wait_for(probe, what, timeout=timeout)
    except TimeoutError as err:
        pytest.fail(f"{err}\n--- llamafactory-cli webui log ---\n{board.log_tail()}", pytrace=False)


def _preview(page, board: LlamaBoard, without: str | None = None) -> str:
    """Presses "Preview command" and returns the command once it is shown (and lacks ``without``)."""
    page.click("Preview command")

    def shown() -> str | None:
        code = page.visible_text_containing("llamafactory-cli train")
        return code.text if code is not None and (without is None or without not in code.text) else None

    return _wait_or_show_log(page, board, shown, "the command preview")


def _choose_model(page, tiny_model: Path, screenshots: Path) -> None:
    """Every Zebra group is listed; choosing one selects the zebra template; the path points at a local model."""
    listed = page.options("Model name", typed="7MLA21GDN")
    assert {name for group in MODEL_GROUPS for name in group} <= set(listed)
    page.choose("Model name", MODEL_NAME)
    page.wait_for(lambda: page.chosen("Chat template") == ["zebra"], "the zebra template to be chosen")
    page.set_text("Model path", str(tiny_model))
    page.screenshot(screenshots / "webui-1-model.png")


def _choose_data_and_hyperparameters(page, data_dir: Path, screenshots: Path) -> None:
    """The fixture dir's dataset and the recipe datasets are offered; CPU-sized settings are entered."""
    page.set_text("Data dir", str(data_dir))
    offered = page.wait_for(
        lambda: (names := page.options("Dataset")) and FIXTURE_DATASET in names and names,
        "the fixture dataset in the dataset dropdown",
    )
    assert set(offered) == _expected_sft_datasets()
    page.choose("Dataset", FIXTURE_DATASET)
    page.set_text("Learning rate", "5e-3")
    page.set_text("Epochs", f"{EPOCHS}.0")
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


def _check_deepspeed_presets(page, board: LlamaBoard, screenshots: Path) -> None:
    """The project's presets are offered next to upstream's stages and reach the command as a json path."""
    presets = sorted(path.stem for path in (REPO / "deepspeed_configs").glob("*.json"))
    assert presets and set(presets) <= set(page.options("DeepSpeed stage", keep_open=True))
    page.screenshot(screenshots / "webui-3-deepspeed-presets.png", page.block("DeepSpeed stage"))
    page.close_dropdown("DeepSpeed stage")
    page.choose("DeepSpeed stage", PRESET)
    assert f"--deepspeed {REPO / 'deepspeed_configs' / PRESET}.json" in _preview(page, board)
    page.choose("DeepSpeed stage", "none")


def _check_cpu_command(page, board: LlamaBoard, tiny_model: Path, data_dir: Path, screenshots: Path) -> None:
    command = _preview(page, board, without="--deepspeed")
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
    page.screenshot(screenshots / "webui-4-preview.png", page.visible_text_containing("llamafactory-cli train"))


def _train(page, board: LlamaBoard, screenshots: Path) -> Path:
    """Starts the run, watches the loss plot being drawn, and returns the run's output directory."""
    output_name = page.chosen("Output dir")[0]
    page.click("Start")
    plots: set[str] = set()

    def finished() -> bool:
        for image in page.visible("//div[@data-testid='matplotlib']//img"):
            plots.add(image.get_attribute("src"))
        failed = page.visible_text_containing("Failed.")
        if failed is not None:
            pytest.fail(f"training failed in the web UI:\n{failed.text}\n--- server log ---\n{board.log_tail()}")
        return page.visible_text_containing("Finished.") is not None

    _wait_or_show_log(page, board, finished, "training to finish", timeout=TRAINING_TIMEOUT_S)
    assert plots, f"the loss plot never appeared while the run was alive\n--- server log ---\n{board.log_tail()}"
    page.screenshot(screenshots / "webui-5-trained.png", page.visible("//div[@data-testid='matplotlib']")[0])
    return board.workdir / "saves" / MODEL_NAME / "lora" / output_name


def _check_run_outputs(output_dir: Path) -> None:
    assert (output_dir / "adapter_model.safetensors").stat().st_size > 0
    assert json.loads((output_dir / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert (output_dir / "training_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    losses = [
        entry["loss"]
        for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()
        if "loss" in (entry := json.loads(line))
    ]
    assert len(losses) == OPTIMIZER_STEPS and all(math.isfinite(loss) for loss in losses)


def _bot_reply(page) -> str | None:
    replies = page.visible("//div[@data-testid='bot']")
    return replies[-1].text.strip() if replies else None


def _chat(page, board: LlamaBoard, checkpoint: str, screenshots: Path) -> str:
    """Loads the base model with the trained adapter and returns the reply to one message."""
    page.open_tab("Chat")
    page.choose("Checkpoint path", checkpoint)
    page.click("Load model")
    _wait_or_show_log(
        page, board, lambda: page.field_containing("Model loaded"), "the model to load", timeout=CHAT_TIMEOUT_S
    )
    assert f"Loaded adapter(s): saves/{MODEL_NAME}/lora/{checkpoint}" in board.log.read_text()
    page.set_number("Maximum new tokens", 16)
    query = page.wait_for(lambda: page.visible("//textarea[@placeholder='Input...']"), "the chat input")[0]
    query.send_keys("Say the number 3.")
    page.click("Submit")

    previous, stable_since = None, time.monotonic()

    def settled() -> str | None:
        """The reply once streaming has left it unchanged for a second."""
        nonlocal previous, stable_since
        reply = _bot_reply(page)
        if reply != previous:
            previous, stable_since = reply, time.monotonic()
            return None
        return reply if reply and time.monotonic() - stable_since > 1.0 else None

    reply = _wait_or_show_log(page, board, settled, "a reply from the trained model", timeout=CHAT_TIMEOUT_S)
    page.screenshot(screenshots / "webui-6-chat.png", page.visible("//div[@data-testid='bot']")[-1])
    return reply


def test_train_and_chat_with_zebra_from_the_browser(browser, board: LlamaBoard, screenshots: Path, workdir: Path):
    from webui.gradio_page import GradioPage  # imports Selenium, which the browser fixture has checked

    page = GradioPage(browser, board.url)
    tiny_model, data_dir = workdir / "zebra-tiny", workdir / "data-fixture"
    _choose_model(page, tiny_model, screenshots)
    _choose_data_and_hyperparameters(page, data_dir, screenshots)
    _check_deepspeed_presets(page, board, screenshots)
    _check_cpu_command(page, board, tiny_model, data_dir, screenshots)
    output_dir = _train(page, board, screenshots)
    _check_run_outputs(output_dir)
    assert _chat(page, board, output_dir.name, screenshots)
