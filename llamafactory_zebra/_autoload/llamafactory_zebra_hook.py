"""Activates llamafactory-zebra in every Python process that imports LLaMA-Factory.

LLaMA-Factory v0 has no plugin entry point, and ``llamafactory-cli train`` re-launches itself through
torchrun, so registering from the user's own script is not enough: each worker is a fresh interpreter.
The wheel installs ``llamafactory_zebra.pth`` next to this module; Python runs it at start-up and
:func:`install` puts a post-import hook on ``sys.meta_path``. The hook does nothing until one of
LLaMA-Factory's registry modules is imported, then hands that module to
``llamafactory_zebra.integration.activation``. Processes that never import LLaMA-Factory pay for one
tiny import and a set lookup per new module name.

The same hook makes Zebra checkpoints load wherever transformers is (``AutoConfig`` /
``AutoModelForCausalLM.from_pretrained``, ``pipeline()``, trl, lm-eval's HF backend) without
``import llamafactory_zebra``: once the first import that brings in transformers' ``configuration_auto``
has finished (no transformers module is then half-initialised), the plugin is imported and registers
``model_type="zebra"`` with the Auto classes. Processes that never import transformers pay nothing more.

Set ``LLAMAFACTORY_ZEBRA_DISABLE=1`` to keep LLaMA-Factory and transformers stock: nothing is registered,
and loading a Zebra checkpoint then fails with a message naming the plugin (a placeholder config class
for ``model_type="zebra"`` that raises), instead of transformers' generic "upgrade transformers".
"""

import _thread  # threading.local's C implementation: importing threading costs start-up time (docs/benchmarks.md)
import importlib
import os
import sys

DISABLE_ENV = "LLAMAFACTORY_ZEBRA_DISABLE"

# LLaMA-Factory modules whose import triggers an activation step (see integration/activation.py).
WATCHED_MODULES = frozenset(
    {
        "llamafactory.extras.constants",
        "llamafactory.data.template",
        "llamafactory.data.converter",
        "llamafactory.data.parser",
        "llamafactory.data.loader",
        "llamafactory.model.loader",
        "llamafactory.model.patcher",
        "llamafactory.hparams.parser",
        "llamafactory.launcher",
        "llamafactory.webui.common",
        "llamafactory.webui.interface",
        "llamafactory.webui.engine",
        "llamafactory.webui.runner",
        "llamafactory.chat.hf_engine",
        "llamafactory.train.tuner",
    }
)


# transformers' module whose import means the Auto classes may soon be asked for a model type.
TRANSFORMERS_AUTO_CONFIG = "transformers.models.auto.configuration_auto"
# ``ZebraConfig.model_type``, written out: this module runs in every process and must not import the package
# (tests/integration/test_load_without_import.py fails if the two differ: the placeholder would not answer).
ZEBRA_MODEL_TYPE = "zebra"


def is_disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


# The finder and loaders follow importlib's protocols without subclassing importlib.abc: importing it
# (importlib.resources, typing, pathlib) costs start-up time in every Python process (docs/benchmarks.md).
class _NotifyingLoader:
    """Runs the real loader, then tells the plugin the module is ready."""

    def __init__(self, loader, fullname):
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        activation = importlib.import_module("llamafactory_zebra.integration.activation")
        activation.on_module_loaded(self._fullname, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _TransformersRegistration:
    """Registers Zebra with transformers' Auto classes after the import that brought in ``configuration_auto``.

    Importing the plugin from inside that import would fail: transformers' ``modeling_utils`` imports
    ``configuration_auto`` halfway through its own body, and the plugin needs ``modeling_utils`` whole. So
    the loaders of transformers' modules count how many are executing (per thread) and the plugin is
    imported when the count drops back to zero.
    """

    def __init__(self, disabled: bool):
        self.disabled = disabled
        self.done = False
        self._depth = _thread._local()

    def exec_module(self, loader, module, fullname):
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        try:
            loader.exec_module(module)
        finally:
            self._depth.value = depth
        if self.disabled and fullname == TRANSFORMERS_AUTO_CONFIG:
            self.done = True
            _register_placeholder_config(module, f"{DISABLE_ENV}=1 switched it off in this process")
        elif depth == 0 and not self.done and TRANSFORMERS_AUTO_CONFIG in sys.modules:
            self.done = True
            self._register()

    def _register(self):
        try:
            importlib.import_module("llamafactory_zebra")  # registers with AutoConfig / AutoModel*
        except Exception as error:  # the user's process goes on; a Zebra load then names this error
            import warnings

            reason = f"importing it failed with {type(error).__name__}: {error}"
            warnings.warn(f"llamafactory-zebra: Zebra checkpoints will not load here: {reason}", stacklevel=2)
            _register_placeholder_config(sys.modules[TRANSFORMERS_AUTO_CONFIG], reason)


class _CountingLoader:
    def __init__(self, loader, fullname, registration):
        self._loader = loader
        self._fullname = fullname
        self._registration = registration

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._registration.exec_module(self._loader, module, self._fullname)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _register_placeholder_config(configuration_auto, reason: str) -> None:
    """``model_type="zebra"`` resolves to a config class whose construction says what is missing.

    transformers' own error for an unknown model type tells the user to upgrade transformers, which
    cannot help. ``import llamafactory_zebra`` replaces the placeholder (it registers with ``exist_ok``).
    """
    message = (
        f"model type '{ZEBRA_MODEL_TYPE}' is provided by the llamafactory-zebra plugin, which is not active "
        f"({reason}). Unset {DISABLE_ENV} or `import llamafactory_zebra` before loading "
        "(`pip install llamafactory-zebra` if it is missing)."
    )

    class ZebraPluginInactiveConfig(configuration_auto.PreTrainedConfig):
        model_type = ZEBRA_MODEL_TYPE

        def __init__(self, *args, **kwargs):
            raise ValueError(message)

        @classmethod
        def from_dict(cls, *args, **kwargs):
            raise ValueError(message)

    configuration_auto.CONFIG_MAPPING.register(ZEBRA_MODEL_TYPE, ZebraPluginInactiveConfig, exist_ok=True)


class PostImportFinder:
    """Wraps the loaders of LLaMA-Factory's watched modules (unless disabled) and of transformers' modules
    (until Zebra is registered with its Auto classes)."""

    def __init__(self, disabled: bool = False):
        self.disabled = disabled
        self.transformers = _TransformersRegistration(disabled)

    def find_spec(self, fullname, path, target=None):
        if self.disabled and fullname != TRANSFORMERS_AUTO_CONFIG:
            return None
        if fullname in WATCHED_MODULES:
            wrap = _NotifyingLoader
        elif not self.transformers.done and (fullname == "transformers" or fullname.startswith("transformers.")):
            wrap = lambda loader, name: _CountingLoader(loader, name, self.transformers)  # noqa: E731
        else:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = wrap(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    if any(isinstance(f, PostImportFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, PostImportFinder(disabled=is_disabled()))
