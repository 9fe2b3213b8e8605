"""The import hook activates the plugin in fresh interpreters, and the environment variable turns it off."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test starts a fresh interpreter

PROBE = """
import json, sys
import llamafactory.extras.constants as constants
import llamafactory.data.template as template
import llamafactory.model.loader  # noqa: F401
from transformers import AutoConfig
try:
    AutoConfig.for_model("zebra")
    auto = True
except ValueError:
    auto = False
print(json.dumps({
    "models": sorted(name for name in constants.SUPPORTED_MODELS if "7MLA21GDN" in name),
    "default_template": constants.DEFAULT_TEMPLATE.get("Zebra-Qwen3-1.7B-7MLA21GDN-1M-Instruct"),
    "template": "zebra" in template.TEMPLATES,
    "auto_config": auto,
    "activation_loaded": "llamafactory_zebra.integration.activation" in sys.modules,
}))
"""


def _probe(**env):
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_fresh_interpreter_registers_zebra_with_llamafactory():
    found = _probe()
    assert found["models"] == [
        "HyLo-Qwen3-1.7B-7MLA21GDN-1M-Instruct",
        "HyLo-Qwen3-1.7B-7MLA21GDN-64K-Instruct",
        "HyLo-Qwen3-1.7B-7MLA21GDN-8K-Instruct",
        "Zebra-Qwen3-1.7B-7MLA21GDN-1M-Instruct",
    ]
    assert found["default_template"] == "zebra"
    assert found["template"] and found["auto_config"] and found["activation_loaded"]


def test_disable_variable_keeps_llamafactory_stock():
    found = _probe(LLAMAFACTORY_ZEBRA_DISABLE="1")
    assert found == {
        "models": [],
        "default_template": None,
        "template": False,
        "auto_config": False,
        "activation_loaded": False,
    }


def test_processes_that_never_import_llamafactory_do_not_load_the_plugin():
    code = "import sys, json; import email.parser; print(json.dumps(sorted(m for m in sys.modules if 'zebra' in m)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(result.stdout) == ["llamafactory_zebra_hook"]
