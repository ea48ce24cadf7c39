# PYTHON_ARGCOMPLETE_OK  (argcomplete: this entry point answers shell completion)
"""``sensorium``: run, inspect and use a Sensorium node."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from sensorium import __version__
from sensorium.client.cli import completion
from sensorium.shared.config import ConfigError
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.explanations import hint

Configure = Callable[[argparse.ArgumentParser], None]
Runner = Callable[[argparse.Namespace], int]

# command -> (its module in sensorium.client.cli, then the names there of its configure,
# its run and its help). Modules are imported by name: a command imports its own module
# only, not every command's (`sensorium invoke` needs no jsonschema, no audit reader).
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "up": ("up", "configure", "run", "__doc__"),
    "status": ("status", "configure", "run", "__doc__"),
    "resume": ("status", "configure_resume", "run_resume", "RESUME_HELP"),
    "stop": ("status", "configure_stop", "run_stop", "STOP_HELP"),
    "invoke": ("invoke", "configure", "run", "__doc__"),
    "actions": ("actions", "configure", "run", "__doc__"),
    "logs": ("logs", "configure", "run", "__doc__"),
    "catalog": ("catalog", "configure", "run", "__doc__"),
    "keys": ("keys", "configure", "run", "__doc__"),
    "ledger": ("ledger", "configure", "run", "__doc__"),
    "audit": ("audit", "configure", "run", "__doc__"),
    "observe": ("observe", "configure", "run", "__doc__"),
    "ops": ("ops", "configure", "run", "__doc__"),
    "flow": ("flow", "configure", "run", "__doc__"),
    "orphans": ("orphans", "configure", "run", "__doc__"),
    "record": ("record", "configure", "run", "__doc__"),
    "replay": ("replay", "configure", "run", "__doc__"),
    "restart": ("status", "configure_restart", "run_restart", "RESTART_HELP"),
    "install-units": ("units", "configure", "run", "__doc__"),
    "doctor": ("doctor", "configure", "run", "__doc__"),
    "explain": ("explain", "configure", "run", "__doc__"),
    "verify-signature": ("verify_signature", "configure", "run", "__doc__"),
    "completion": ("completion", "configure", "run", "__doc__"),
}


def command(name: str) -> tuple[Configure, Runner, str | None]:
    """``name``'s configure, run and help, its module imported now."""
    module, configure, runner, doc = COMMANDS[name]
    mod = importlib.import_module(f"sensorium.client.cli.{module}")
    return getattr(mod, configure), getattr(mod, runner), getattr(mod, doc)


def named(argv: list[str]) -> str | None:
    """The command ``argv`` runs, when the top level holds nothing else before it but
    ``--state-dir`` (the only top-level option with a value, also abbreviated as
    argparse allows); None for anything else (``--help``, a typo), which gets the
    parser with every command."""
    args = iter(argv)
    for arg in args:
        if arg in COMMANDS:
            return arg
        option, eq, _value = arg.partition("=")
        if len(option) > 2 and "--state-dir".startswith(option):
            if not eq:
                next(args, None)  # its value
            continue
        return None
    return None


# Codes that mean the request never ran: exit status 2, like a usage error.
REFUSED_BEFORE_RUNNING = frozenset(
    {"parameters-invalid", "action-not-allowlisted", "execution-mode-unsupported", "flow-invalid"}
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI's parser; with ``only``, that command's alone (the others are not
    imported, and argparse would refuse them)."""
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
    for name in [only] if only is not None else COMMANDS:
        configure, runner, doc = command(name)
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
    argv = sys.argv[1:] if argv is None else argv
    # A shell's TAB completes against every command.
    parser = build_parser(None if "_ARGCOMPLETE" in os.environ else named(argv))
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
