"""Print the shell completion script for bash, zsh or fish.

    eval "$(sensorium completion bash)"     # in ~/.bashrc
    eval "$(sensorium completion zsh)"      # in ~/.zshrc, after compinit
    sensorium completion fish | source      # in ~/.config/fish/config.fish

Subcommands and options complete offline; action ids complete from the running
node's catalog (nothing when it is down), diagnostic codes from `sensorium explain`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from typing import Any

SHELLS = ("bash", "zsh", "fish")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to print the script for")


def run(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    # The script calls `sensorium` itself, so no register-python-argcomplete is needed.
    print(shellcode(["sensorium"], shell=args.shell), end="")
    return 0


def _catalog(parsed_args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The live node's action ids and groups; nothing when it cannot answer at once.

    A TAB must never hang or print: a short connect timeout, and every failure is
    an empty list (argcomplete shows no completions rather than an error).
    """
    from sensorium.client.api import Client

    try:
        state_dir = getattr(parsed_args, "state_dir", None)
        with Client(state_dir=state_dir, connect_timeout_s=0.3) as client:
            actions = client.describe().actions
    except Exception:
        return [], []
    return [a.action_id for a in actions], sorted({a.group for a in actions if a.group})


def action_ids(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> Iterable[str]:
    ids, _groups = _catalog(parsed_args)
    return [a for a in ids if a.startswith(prefix)]


def grants(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> Iterable[str]:
    ids, groups = _catalog(parsed_args)
    return [g for g in [*groups, *ids, "*", "audit"] if g.startswith(prefix)]


def codes(prefix: str, **_: Any) -> Iterable[str]:
    from sensorium.shared.explanations import EXPLANATIONS

    return sorted(c for c in EXPLANATIONS if c.startswith(prefix))


# Which arguments complete what, by destination: the command modules stay unaware.
COMPLETERS: dict[str, Callable[..., Iterable[str]]] = {
    "action_id": action_ids,  # invoke, ledger
    "action": action_ids,  # logs --action, audit list --action
    "synthetic": action_ids,  # replay --synthetic
    "grant": grants,  # keys client add --grant
    "groups": grants,  # keys client grant/ungrant
    "code": codes,  # explain
}


def _attach(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _attach(sub)
        elif (completer := COMPLETERS.get(action.dest)) is not None:
            action.completer = completer  # type: ignore[attr-defined]


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request and exit; return at once on any other run."""
    if "_ARGCOMPLETE" not in os.environ:
        return  # argcomplete is imported only when a shell asks
    import argcomplete

    _attach(parser)
    # Options only once a "-" is typed, as git does: a bare TAB lists what to type next.
    argcomplete.autocomplete(parser, always_complete_options=False)
