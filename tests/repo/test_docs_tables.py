"""Docs tables that restate code data are checked against it, as the LLaMA-Factory seam table is.

- ``docs/gpu.md``'s kernel table: generated from the registry's rows and switches (``tools/kernel_table.py``), so
  the page must hold exactly the generated text;
- the known-issue tables of ``docs/gpu.md`` (CUDA, and CPU) and ``docs/rocm.md`` (ROCm): a row per
  ``kernels/known_issues.py`` entry, holding its bounded version ranges, its upstream references (repository
  name and issue number) and, on ROCm, whether the plugin applies a workaround;
- ``docs/serving.md``'s count of the vLLM names the serving layer reads (``seams.VLLM_API``).

A new, removed or changed entry, switch, version bound or upstream reference fails here until the page says it.
"""

import re
from dataclasses import replace

from kernel_table import COMMAND, documented_table, kernel_table
from repo_paths import DOCS

from llamafactory_zebra.kernels import KERNELS, KNOWN_ISSUES, SWITCHES
from llamafactory_zebra.serving.vllm import seams


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row of ``text`` (header and separator rows included)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in text.splitlines()
        if line.startswith("| ")
    ]


def known_issue_problems(pages: dict[str, str], issues=KNOWN_ISSUES) -> list[str]:
    rows = {
        key.group(1): (name, " | ".join(row))
        for name, text in pages.items()
        for row in table_rows(text)
        if (key := re.match(r"`([^`]+)`", row[0]))
    }
    problems = []
    for issue in issues:
        page = "rocm.md" if issue.vendor == "rocm" else "gpu.md"
        name, row = rows.get(issue.key, (None, ""))
        if name != page:
            problems.append(f"{issue.key}: no row in docs/{page}")
            continue
        # A bounded version range: its package and bounds (an open one, "fla-core (any)", need not be spelled).
        bounded = [version for version in issue.versions if version.low or version.high]
        bounds = [bound for version in bounded for bound in (version.package, version.low, version.high)]
        # A reference as the pages write it: the repository's name and the issue number (``#640, #826``).
        references = [part for ref in issue.upstream for part in ref.split()[0].rsplit("/", 1)[-1].split("#", 1)]
        references = [part if part[0].isalpha() else f"#{part}" for part in references]
        missing = [text for text in [*bounds, *references] if text and text not in row]
        if missing:
            problems.append(f"{issue.key}: its row in docs/{page} does not say {', '.join(missing)}")
        if issue.vendor == "rocm" and ("**applied**" in row) != (issue.workaround is not None):
            problems.append(f"{issue.key}: docs/{page} and the entry disagree on whether the plugin applies a fix")
    return problems


def test_the_kernel_table_is_the_registrys():
    page = (DOCS / "gpu.md").read_text(encoding="utf-8")
    assert documented_table(page) == kernel_table(), (
        f"docs/gpu.md's kernel table is not the registry's (kernels/registry.py, switches.py): run `{COMMAND}`"
    )


def test_a_changed_kernel_row_is_reported(monkeypatch):
    """An entry fewer, or a switch that no longer governs an op, changes the generated table (the page then fails
    the test above)."""
    import kernel_table as generator

    page = documented_table((DOCS / "gpu.md").read_text(encoding="utf-8"))
    last = max((kernel for kernel in KERNELS if kernel.op == "GDN recurrent"), key=lambda kernel: kernel.priority)
    monkeypatch.setattr(generator, "KERNELS", tuple(kernel for kernel in KERNELS if kernel is not last))
    assert last.label not in kernel_table() and kernel_table() != page
    monkeypatch.setattr(generator, "KERNELS", KERNELS)
    packed_sdpa = next(switch for switch in SWITCHES if switch.env_var == "ZEBRA_PACKED_SDPA")
    others = tuple(switch for switch in SWITCHES if switch is not packed_sdpa)
    monkeypatch.setattr(generator, "SWITCHES", (*others, replace(packed_sdpa, ops=())))
    assert "dense block-causal mask | — |" in kernel_table() and kernel_table() != page


def test_every_known_issue_has_its_row():
    pages = {name: (DOCS / name).read_text(encoding="utf-8") for name in ("gpu.md", "rocm.md")}
    assert known_issue_problems(pages) == []


def test_a_changed_known_issue_row_is_reported():
    pages = {name: (DOCS / name).read_text(encoding="utf-8") for name in ("gpu.md", "rocm.md")}
    hopper = KNOWN_ISSUES[0]
    moved = replace(hopper, versions=(hopper.versions[0], replace(hopper.versions[1], high="3.8.0")))
    assert known_issue_problems(pages, (moved,)) == [
        "fla-hopper-triton-gated-bwd: its row in docs/gpu.md does not say 3.8.0"
    ]
    dropped = {**pages, "rocm.md": pages["rocm.md"].replace("| `triton-cache-shared-by-ranks`", "| `x`")}
    assert known_issue_problems(dropped) == ["triton-cache-shared-by-ranks: no row in docs/rocm.md"]


def test_the_serving_docs_count_the_vllm_names():
    text = (DOCS / "serving.md").read_text(encoding="utf-8")
    assert f"lists the {len(seams.VLLM_API)} vLLM names" in " ".join(text.split())
