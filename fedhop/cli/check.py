"""``fedhop check SPEC``: integration-test a protocol (:mod:`fedhop.check`): the spec in-process and over real
processes, a PS crash and resume, a killed client; a verdict table, exit 0 only if every check holds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedhop.cli.console import HelpFormatter, add_run_options, check_device, load_spec, run_folder
from fedhop.common.exit_codes import ExitCode, Fatal


def cmd_check(a: argparse.Namespace) -> int:
    from fedhop.check import CheckOptions, KillClient, check
    from fedhop.common.engine.preflight import check_user_code

    try:
        kill = KillClient.parse(a.kill_client) if a.kill_client else None
        skip = frozenset(s.strip() for s in a.skip.split(",") if s.strip()) if a.skip else frozenset()
        CheckOptions(Path("."), skip=skip)  # the skip names, checked before anything runs
    except ValueError as e:
        raise Fatal(ExitCode.USAGE, str(e)) from None
    spec = load_spec(a.spec, a.set)
    check_user_code(spec, source=a.spec or "<default spec>")
    check_device(a.device)
    options = CheckOptions(run_folder(a.out, a.force, spec.name, "check"), crash_round=a.crash_round, kill=kill,
                           skip=skip, device=a.device)
    if not a.quiet:
        print(f"fedhop check: {spec.algorithm.name} in-process and over real processes; runs in {options.out}",
              file=sys.stderr)
    report = check(spec, options)
    (options.out / "check.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    print(report.table())
    print(f"fedhop check: {'every check holds' if report.ok else 'FAILED'} ({options.out / 'check.json'})")
    return 0 if report.ok else int(ExitCode.FAILED)


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("check", help="integration-test a protocol: both engines bit-identical, bytes as declared, "
                       "a PS crash resumed, a client killed", formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    add_run_options(s, "check")
    s.add_argument("--device", default="cpu", help="the device both engines run on")
    s.add_argument("--crash-round", type=int, metavar="R",
                   help="the crash check kills the PS once R rounds are done (default: half the rounds)")
    s.add_argument("--kill-client", metavar="ID@ROUND",
                   help="the fault check kills client ID once ROUND rounds are done (default: after round 1, the "
                        "last client the protocol still asks for work)")
    s.add_argument("--skip", metavar="CHECKS", help="comma-separated checks not to run: formula, crash, fault")
    s.add_argument("--quiet", action="store_true", help="only the table")
    s.set_defaults(fn=cmd_check)
