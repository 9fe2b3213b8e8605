"""``llamafactory-zebra doctor``: runs the environment checks (``environment/checks.py``) and prints them.

The kernel checks resolve for the machine ``ZEBRA_FAKE_STACK`` describes when it is set (a test and
diagnosis aid, ``kernels/stack.py``); the other checks always look at this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict

from ..environment.checks import (
    FAIL,
    OK,
    WARN,
    all_checks,
    exit_code,
    inspect_machine,
    kernel_resolution,
    render,
    run_checks,
)
from .commands import SUBCOMMANDS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help=SUBCOMMANDS["doctor"].help,
        description="Check the software stack for Zebra training. Exit code 0: no failed check; 1: a check "
        "failed; 2: bad command line. No GPU is a warning unless --require-gpu.",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--require-gpu", action="store_true", help="fail (not warn) when no GPU is visible")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # DeepSpeed and friends log to stdout while being imported; keep stdout for the table or the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        results = run_checks(inspect_machine(), all_checks(args.require_gpu))
    code = exit_code(results)
    if args.json:
        counts = {s: sum(r.status == s for r in results) for s in (OK, WARN, FAIL)}
        phases = (kernel_resolution(True), kernel_resolution(False), kernel_resolution(False, serving=True))
        kernels = {r.phase: r.as_dict() for r in phases}
        report = {"checks": [asdict(r) for r in results], "kernels": kernels, "summary": counts, "exit_code": code}
        print(json.dumps(report, indent=2))
    else:
        print(render(results))
    return code
