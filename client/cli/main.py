# PYTHON_ARGCOMPLETE_OK  (argcomplete: this entry point answers shell completion)
"""``sensorium``: run, inspect and use a Sensorium node."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from sensorium import __version__
from sensorium.client.cli import (
    actions,
    audit,
    catalog,
    completion,
    doctor,
    explain,
    flow,
    invoke,
    keys,
    ledger,
    logs,
    observe,
    ops,
    orphans,
    record,
    replay,
    status,
    units,
    up,
)
from sensorium.client.cli import (
    verify_signature as vsig,
)
from sensorium.shared.config import ConfigError
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.explanations import hint

COMMANDS: dict[
    str,
    tuple[
        Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str | None
    ],
] = {
    "up": (up.configure, up.run, up.__doc__),
    "status": (status.configure, status.run, status.__doc__),
    "resume": (status.configure_resume, status.run_resume, status.RESUME_HELP),
    "stop": (status.configure_stop, status.run_stop, status.STOP_HELP),
    "invoke": (invoke.configure, invoke.run, invoke.__doc__),
    "actions": (actions.configure, actions.run, actions.__doc__),
    "logs": (logs.configure, logs.run, logs.__doc__),
    "catalog": (catalog.configure, catalog.run, catalog.__doc__),
    "keys": (keys.configure, keys.run, keys.__doc__),
    "ledger": (ledger.configure, ledger.run, ledger.__doc__),
    "audit": (audit.configure, audit.run, audit.__doc__),
    "observe": (observe.configure, observe.run, observe.__doc__),
    "ops": (ops.configure, ops.run, ops.__doc__),
    "flow": (flow.configure, flow.run, flow.__doc__),
    "orphans": (orphans.configure, orphans.run, orphans.__doc__),
    "record": (record.configure, record.run, record.__doc__),
    "replay": (replay.configure, replay.run, replay.__doc__),
    "restart": (status.configure_restart, status.run_restart, status.RESTART_HELP),
    "install-units": (units.configure, units.run, units.__doc__),
    "doctor": (doctor.configure, doctor.run, doctor.__doc__),
    "explain": (explain.configure, explain.run, explain.__doc__),
    "verify-signature": (vsig.configure, vsig.run, vsig.__doc__),
    "completion": (completion.configure, completion.run, completion.__doc__),
}


# Codes that mean the request never ran: exit status 2, like a usage error.
REFUSED_BEFORE_RUNNING = frozenset(
    {"parameters-invalid", "action-not-allowlisted", "execution-mode-unsupported", "flow-invalid"}
)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS lets --state-dir stand before or after the subcommand.
    common.add_argument(
        "--state-dir",
        default=argparse.SUPPRESS,
        help="state directory (default: $SENSORIUM_STATE_DIR, else ~/.local/state/sensorium)",
    )
    parser = argparse.ArgumentParser(prog="sensorium", parents=[common], description=__doc__)
    parser.add_argument("--version", action="version", version=f"sensorium {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (configure, runner, doc) in COMMANDS.items():
        summary = (doc or "").strip().splitlines()[0] if doc else ""
        p = sub.add_parser(
            name,
            parents=[common],
            help=summary,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        configure(p)
        p.set_defaults(run=runner)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    completion.autocomplete(parser)  # a shell's TAB: answers and exits before anything runs
    args = parser.parse_args(argv)
    if not hasattr(args, "state_dir"):
        args.state_dir = None
    try:
        code: int = args.run(args)
    except CodedError as exc:  # SensoriumError, and a store's own storage-unavailable
        print(f"sensorium: {exc.code}: {exc.message}", file=sys.stderr)
        if exc.path:
            print(f"  at {exc.path}", file=sys.stderr)
        if "outcome/id" in exc.detail:  # its audit record: `sensorium audit show`
            print(f"  receipt outcome:{exc.detail['outcome/id']}", file=sys.stderr)
        if see := hint(exc.code):
            print(see, file=sys.stderr)
        return 2 if exc.code in REFUSED_BEFORE_RUNNING else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `sensorium logs | head`: the reader left; nothing went wrong here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (ConfigError, OSError, ValueError) as exc:
        # What is on disk is wrong (a broken node.json, a key of the wrong mode…): say
        # which and where, not a traceback.
        print(f"sensorium: {RuntimeErrorCode.CONFIG_INVALID}: {exc}", file=sys.stderr)
        print(hint(RuntimeErrorCode.CONFIG_INVALID), file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
