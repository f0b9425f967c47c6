"""The command line: provisioner-status [--expected-dir DIR] [--plan FILE] [--json] [--textfile DIR]."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable

from provisioner_status.common import BAD_INPUT, EXPECTED_DIR, PLAN_FILE, SCHEMA, TEXTFILE_NAME, BadInput
from provisioner_status.probes import Probes
from provisioner_status.report import exit_code, load_expected, measure_all, metric_samples, render_table, report, write_textfile

DESCRIPTION = "the expected vs the live value of every setting the roles manage"


def main(argv: list[str] | None = None, probes_factory: Callable[[], Probes] = Probes) -> int:
    parser = argparse.ArgumentParser(prog="provisioner-status", description=DESCRIPTION)
    parser.add_argument("--expected-dir", default=EXPECTED_DIR, help=f"the roles' declarations (default {EXPECTED_DIR})")
    parser.add_argument("--plan", default=PLAN_FILE, help=f"the plan the host recorded (default {PLAN_FILE})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--textfile", metavar="DIR", help=f"also write DIR/{TEXTFILE_NAME} for node_exporter")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        checks = load_expected(args.expected_dir)
        settings = measure_all(checks, probes_factory())
    except BadInput as exc:
        if args.json:
            # On stdout, where the caller reads the result: over SSH with a terminal (Ansible's
            # script module) stderr is merged into stdout and the caller's stderr holds only
            # ssh's own "Shared connection to HOST closed".
            print(json.dumps({"schema": SCHEMA, "host": socket.gethostname(), "error": str(exc), "fix": exc.fix}))
        else:
            print(f"provisioner-status: {exc}; {exc.fix}: provisioner up", file=sys.stderr)
        return BAD_INPUT
    result = report(settings, time.monotonic() - started)
    if args.textfile:
        if not os.path.isdir(args.textfile):
            print(f"provisioner-status: --textfile {args.textfile} is not a directory", file=sys.stderr)
            return BAD_INPUT
        try:
            with open(args.plan, encoding="utf-8") as f:
                plan = json.load(f)
        except (OSError, ValueError):
            plan = {}
        write_textfile(args.textfile, metric_samples(result, plan, time.time()))
    print(json.dumps(result, indent=1) if args.json else render_table(result))
    return exit_code(settings)
