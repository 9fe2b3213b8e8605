"""AMD's recommended ROCm training settings, one ``.env`` file per GPU architecture, shipped in the package.

The files under ``environment/rocm/`` are the only copy: the launch scripts in ``examples/rocm/``
source them, ``docker run --env-file`` reads them, and ``doctor`` compares the environment against
them and names the installed file in its hint, so the path it prints exists on every install.
"""

from __future__ import annotations

from pathlib import Path

ENV_DIR = Path(__file__).parent / "rocm"
ENV_FILE_NAMES = {"gfx942": "mi300x.env", "gfx90a": "mi250.env"}


def rocm_env_file(arch: str) -> Path | None:
    """The installed ``.env`` file for a GPU architecture (``gfx942``: MI300X, ``gfx90a``: MI250), else None."""
    name = ENV_FILE_NAMES.get(arch)
    return ENV_DIR / name if name else None


def rocm_settings(arch: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of the architecture's ``.env`` file (comments and blank lines skipped)."""
    path = rocm_env_file(arch)
    if path is None:
        raise KeyError(f"no recommended ROCm settings for {arch}; known: {', '.join(sorted(ENV_FILE_NAMES))}")
    settings = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings[key] = value
    return settings
