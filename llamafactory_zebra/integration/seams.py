"""The LLaMA-Factory side of the seam door: every place where llamafactory-zebra changes LLaMA-Factory 0.9.5
behaviour, or relies on one of its names (and the few in transformers, accelerate and DeepSpeed it drives).

:data:`LLAMAFACTORY_SEAMS` is the table (the mechanism is ``llamafactory_zebra/seam.py``): each feature
module declares the records of the names it wraps next to the wrappers (``loading``, ``datasets``,
``training``, ``prerequisites``, ``kernel_choice``, ``launcher``, ``webui``, ``chat_exit``, ``worker_exit``,
``distill``, ``sequence_parallel``), and the names only called elsewhere are listed here. The import hook calls
:func:`install` when each watched LLaMA-Factory module loads: it checks every record of that module and
applies its wrappers and registrations, so every worker, the web UI and the API server get the same
changes. A few wrappers apply only when a run needs them (``on_import=False``: the SFT trainer class,
the distillation log line) or during one call (DeepSpeed's ``initialize``, one Accelerator's
``prepare``, one callback's ``_write_log``). ``tests/integration/test_upstream_seams.py`` runs the drift check over
the whole table against the installed packages and compares it with ``docs/llamafactory.md``; the
transformers side (registries, no attribute replaced) is ``registrations.py``.
"""

from __future__ import annotations

from types import ModuleType

from ..seam import Seam
from ..seam import install as install_seams
from . import (
    SEAM_HINT,
    chat_exit,
    datasets,
    distill,
    kernel_choice,
    launcher,
    loading,
    prerequisites,
    sequence_parallel,
    training,
    webui,
    worker_exit,
)

# Names the plugin calls without wrapping them, where no wrapper's module declares them.
CALLED: tuple[Seam, ...] = (
    Seam("llamafactory.extras.ploting", "plot_loss", ("save_dictionary", "keys"),
         why="distill/trainer.py: one plot per distillation metric"),
    Seam("transformers.integrations.deepspeed", "set_hf_deepspeed_config", ("hf_deepspeed_config_obj",),
         why="distill/teacher.py: the teacher loads outside ZeRO-3's partitioning"),
    Seam("transformers.integrations.deepspeed", "unset_hf_deepspeed_config", (),
         why="distill/teacher.py"),
)  # fmt: skip

LLAMAFACTORY_SEAMS: tuple[Seam, ...] = (
    *loading.SEAMS,
    *launcher.SEAMS,
    *training.SEAMS,
    *prerequisites.SEAMS,
    *kernel_choice.SEAMS,
    *datasets.SEAMS,
    *webui.SEAMS,
    *chat_exit.SEAMS,
    *worker_exit.SEAMS,
    *distill.SEAMS,
    *sequence_parallel.SEAMS,
    *CALLED,
)


def install(module: ModuleType, only: tuple[str, ...] | None = None) -> None:
    """Check ``module``'s records and apply its wrappers and registrations (the import hook's one step)."""
    install_seams(LLAMAFACTORY_SEAMS, module, only, SEAM_HINT)


def modules_installed_at_import() -> set[str]:
    """The LLaMA-Factory modules whose import applies a change (the hook watches exactly these)."""
    return {s.module for s in LLAMAFACTORY_SEAMS if s.on_import and (s.wrapper or s.register)}
