"""Zebra checkpoints load wherever transformers is: fresh interpreters that never import the plugin.

The install-time hook (``llamafactory_zebra_hook``, copied into site-packages) registers Zebra with
transformers' Auto classes once ``configuration_auto`` has been imported; ``LLAMAFACTORY_ZEBRA_DISABLE=1``
leaves transformers stock, and then a Zebra load fails with the plugin named in its last line.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from installed_hook import assert_installed_hook_is_current

pytestmark = pytest.mark.slow

# Never imports llamafactory_zebra. transformers' modeling_utils comes first: it imports configuration_auto
# halfway through its own body, the import order in which registering too early would break.
LOAD = """
import json, sys
import transformers.modeling_utils
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
import torch
path = sys.argv[1]
config = AutoConfig.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path).eval()
tokenizer = AutoTokenizer.from_pretrained(path)
with torch.no_grad():
    logits = model(torch.tensor([[3, 14, 15, 92, 65]]), use_cache=False).logits
print(json.dumps({"config": type(config).__name__, "model": type(model).__name__,
                  "tokenizer_vocab": len(tokenizer), "logits": logits[0, -1].tolist()}))
"""


def _run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "LLAMAFACTORY_ZEBRA_DISABLE"}
    environment.update(HF_HUB_OFFLINE="1", **env)
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=environment, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module", autouse=True)
def installed_hook_is_current():
    assert_installed_hook_is_current()


def test_a_process_that_never_imports_the_plugin_loads_zebra_through_auto_classes(tiny_model_dir):
    from llamafactory_zebra import ZebraForCausalLM

    result = _run(LOAD, str(tiny_model_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert (found["config"], found["model"]) == ("ZebraConfig", "ZebraForCausalLM")
    assert found["tokenizer_vocab"] > 0
    model = ZebraForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        want = model(torch.tensor([[3, 14, 15, 92, 65]]), use_cache=False).logits[0, -1]
    torch.testing.assert_close(torch.tensor(found["logits"]), want, rtol=1e-5, atol=1e-6)


def test_importing_transformers_alone_does_not_load_the_plugin():
    code = "import sys, transformers; print('llamafactory_zebra' in sys.modules)"
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_disabled_plugin_makes_the_load_fail_naming_the_plugin(tiny_model_dir):
    result = _run(LOAD, str(tiny_model_dir), LLAMAFACTORY_ZEBRA_DISABLE="1")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: model type 'zebra' is provided by the llamafactory-zebra plugin"), last
    assert "LLAMAFACTORY_ZEBRA_DISABLE=1" in last and "import llamafactory_zebra" in last


def test_disabled_plugin_can_still_be_imported_explicitly(tiny_model_dir):
    code = "import llamafactory_zebra, sys\n" + LOAD
    result = _run(code, str(tiny_model_dir), LLAMAFACTORY_ZEBRA_DISABLE="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["model"] == "ZebraForCausalLM"
