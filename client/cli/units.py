"""Write systemd units or launchd plists that run this installation's processes.

sensorium install-units --systemd [--user] [--dest DIR] [--state-dir DIR] [--dry-run] [--force]
sensorium install-units --launchd [--user] [--dest DIR] [--state-dir DIR] [--dry-run] [--force]

systemd: sensorium-os, sensorium-core and sensorium-poller services and the
sensorium.target grouping them, into /etc/systemd/system (--user:
~/.config/systemd/user). The state directory defaults to StateDirectory=sensorium:
/var/lib/sensorium (--user: ~/.local/state/sensorium).
launchd: org.sensorium.{os,core,poller}.plist into /Library/LaunchDaemons (--user:
~/Library/LaunchAgents); state in /usr/local/var/sensorium (--user:
~/.local/state/sensorium).

--state-dir DIR (or $SENSORIUM_STATE_DIR) names another state directory. The units
start this installation's console scripts (or `python -m` when there are none). An
existing file that differs is replaced only with --force; --dry-run prints what
would be written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sensorium.deploy import units
from sensorium.shared.paths import STATE_DIR_ENV, StatePathError, resolve_state_dir


def configure(parser: argparse.ArgumentParser) -> None:
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument(
        "--systemd", dest="kind", action="store_const", const="systemd", help="systemd units"
    )
    kind.add_argument(
        "--launchd", dest="kind", action="store_const", const="launchd", help="launchd plists"
    )
    parser.add_argument("--user", action="store_true", help="units for your own user manager")
    parser.add_argument("--dest", help="where to write them (default: where the manager looks)")
    parser.add_argument("--dry-run", action="store_true", help="print them; write nothing")
    parser.add_argument("--force", action="store_true", help="replace files that differ")


def run(args: argparse.Namespace) -> int:
    kind: units.Kind = args.kind
    explicit = args.state_dir or os.environ.get(STATE_DIR_ENV)
    state = Path(explicit).expanduser().absolute() if explicit else None
    opts = units.Options(kind, args.user, units.find_launcher(), state)
    try:
        files = units.render(opts)
    except StatePathError as exc:
        print(f"sensorium: {exc}", file=sys.stderr)
        return 2
    dest = (
        Path(args.dest).expanduser().absolute()
        if args.dest
        else units.default_dest(kind, args.user)
    )
    targets = {dest / name: data for name, data in files.items()}
    differing = [p for p, data in targets.items() if p.exists() and p.read_bytes() != data]
    if args.dry_run:
        for path, data in targets.items():
            note = " (differs from the file there)" if path in differing else ""
            print(f"# ---- {path}{note}")
            print(data.decode(), end="")
        return 0
    if differing and not args.force:
        print(
            "sensorium: install-units: these files exist and differ from what this "
            "installation would write:",
            file=sys.stderr,
        )
        for path in differing:
            print(f"  {path}", file=sys.stderr)
        print(
            "nothing was written. See the new text with --dry-run; replace them with --force.",
            file=sys.stderr,
        )
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    for path, data in targets.items():
        if path.exists() and path not in differing:
            print(f"unchanged {path}")
            continue
        _write(path, data)
        print(f"{'replaced' if path in differing else 'wrote'} {path}")
    literal = opts.literal_state()
    if literal is not None:
        _prepare_state(literal)
    print(f"runs: {opts.launcher.describe()}")
    _next_steps(opts, dest, list(targets))
    return 0


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a crash never leaves half a unit."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # whatever the umask says: the manager reads it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _prepare_state(root: Path) -> None:
    """A state directory systemd does not create (or launchd's stderr files need)."""
    (root / "logs").mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)


def _next_steps(opts: units.Options, dest: Path, written: list[Path]) -> None:
    state = opts.state()
    if opts.kind == "systemd":
        ctl = "systemctl --user" if opts.user else "systemctl"
        if dest != units.default_dest("systemd", opts.user):
            print(f"note: {dest} is not where systemd looks; `{ctl} link` each file, or move them")
        print(f"next: {ctl} daemon-reload && {ctl} enable --now {units.TARGET}")
        if opts.user:
            print("      loginctl enable-linger  # to keep it running while you are logged out")
        journal = f"journalctl {'--user ' if opts.user else ''}-u 'sensorium-*'"
        print(f"logs: {journal}  (and {state}/logs/)")
    else:
        domain = f"gui/{os.getuid()}" if opts.user else "system"
        print("next:")
        for path in written:
            print(f"  launchctl bootstrap {domain} {path}")
    if Path(state) != resolve_state_dir(None):
        print(f"cli:  export SENSORIUM_STATE_DIR={state}  # or pass --state-dir {state}")
