"""llamafactory-zebra: AMD's Zebra MLA + Gated DeltaNet hybrids for transformers and LLaMA-Factory.

Importing the package registers ``model_type="zebra"`` with transformers' Auto classes, so
``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` load Zebra checkpoints without
``trust_remote_code``. Where the package is installed, the start-up hook (``_autoload/``) imports it
as soon as transformers' Auto classes are imported, so other programs need no ``import`` of their own.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_zebra import PRESETS, ZebraConfig
from .modeling_zebra import ZebraForCausalLM, ZebraHybridCache, ZebraModel, ZebraPreTrainedModel

__version__ = "0.1.0"

AutoConfig.register(ZebraConfig.model_type, ZebraConfig, exist_ok=True)
AutoModel.register(ZebraConfig, ZebraModel, exist_ok=True)
AutoModelForCausalLM.register(ZebraConfig, ZebraForCausalLM, exist_ok=True)

__all__ = [
    "PRESETS",
    "ZebraConfig",
    "ZebraForCausalLM",
    "ZebraHybridCache",
    "ZebraModel",
    "ZebraPreTrainedModel",
    "__version__",
]
