"""The committed systemd units and launchd plists, rewritten for this installation.

One truth: the files in ``systemd/`` and ``launchd/`` are real, installable units for
the documented default installation (console scripts in ``/usr/local/bin``; state in
``%S/sensorium`` for systemd, ``/usr/local/var/sensorium`` for launchd). Rendering
changes only what differs here, so the hardening and every comment stay in those
files:

* the program: this installation's console script (beside ``sys.executable``), or
  ``<python> -m <module>`` when the scripts are missing;
* the state directory, when one is given and for ``--user``: systemd then drops
  ``StateDirectory=``, and a system unit names the directory in ``ReadWritePaths=``;
* ``--user`` (systemd): the options that need a mount namespace or capabilities are
  left out, because a user manager gets those only from an unprivileged user
  namespace, which many kernels refuse; the seccomp-based ones stay;
* paths the units must reach under ``/home`` or ``/tmp`` relax ``ProtectHome=`` and
  ``PrivateTmp=``, which would otherwise hide them.
"""

from __future__ import annotations

import os
import plistlib
import sys
import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from sensorium.shared.paths import StatePaths, default_state_dir

Kind = Literal["systemd", "launchd"]

# What the committed files name; rendering replaces exactly these.
DEFAULT_BIN = "/usr/local/bin"
SYSTEMD_STATE = "%S/sensorium"
LAUNCHD_STATE = "/usr/local/var/sensorium"
SYSTEMD_SYSTEM_STATE = "/var/lib/sensorium"  # what %S/sensorium is for the system manager
TARGET = "sensorium.target"
# What sensorium.target's start and stop wait on (see its comments).
HELPERS = ("sensorium-ready.service", "sensorium-drain.service")

# Need a mount namespace or capabilities: only a system manager grants them reliably.
SYSTEM_ONLY = frozenset(
    {
        "User",
        "Group",
        "CapabilityBoundingSet",
        "AmbientCapabilities",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateMounts",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "ProtectProc",
        "ProcSubset",
        "ReadWritePaths",
    }
)
HOME_DIRS = ("/home", "/root", "/run/user")
TMP_DIRS = ("/tmp", "/var/tmp")


@dataclass(frozen=True)
class Process:
    script: str  # the console script of [project.scripts]
    module: str  # what ``python -m`` runs instead
    log_name: str  # logs/<log_name>.jsonl

    @property
    def unit(self) -> str:
        return f"{self.script}.service"

    @property
    def label(self) -> str:
        return "org.sensorium." + self.script.removeprefix("sensorium-")

    @property
    def plist(self) -> str:
        return f"{self.label}.plist"


PROCESSES = (
    Process("sensorium-os", "sensorium.connectors.os", "connector"),
    Process("sensorium-core", "sensorium.core", "core"),
    Process("sensorium-poller", "sensorium.poller", "poller"),
)


@dataclass(frozen=True)
class Launcher:
    """How a unit starts a process: a console script in ``bin_dir``, else ``python -m``."""

    python: Path
    bin_dir: Path | None
    # Where ``sensorium`` is imported from: the units must be able to read it.
    package_dir: Path

    def argv(self, p: Process) -> list[str]:
        if self.bin_dir is not None:
            return [str(self.bin_dir / p.script)]
        return [str(self.python), "-m", p.module]

    def describe(self) -> str:
        if self.bin_dir is not None:
            return f"console scripts in {self.bin_dir}"
        return f"{self.python} -m (no console scripts found beside it)"


def find_launcher() -> Launcher:
    """This installation: the first scripts directory holding all three console scripts."""
    import sensorium

    package = Path(sensorium.__file__).parent
    python = Path(sys.executable).absolute()
    candidates = [
        python.parent,
        Path(sysconfig.get_path("scripts")),
        Path(sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user"))),
    ]
    for d in dict.fromkeys(c.absolute() for c in candidates):
        if all(os.access(d / p.script, os.X_OK) for p in PROCESSES):
            return Launcher(python, d, package)
    return Launcher(python, None, package)


@dataclass(frozen=True)
class Options:
    kind: Kind
    user: bool
    launcher: Launcher
    # None: the default, %S/sensorium (StateDirectory=) for a systemd system unit, the
    # CLI's own default for --user, /usr/local/var/sensorium for a launchd daemon.
    state_dir: Path | None = None

    def literal_state(self) -> Path | None:
        """The state directory the units name as a path; None: ``StateDirectory=``."""
        if self.state_dir is not None:
            return self.state_dir
        if self.user:
            # Not %S for a systemd user unit: before systemd 254 that is ~/.config, not
            # the ~/.local/state the CLI looks in.
            return default_state_dir()
        return Path(LAUNCHD_STATE) if self.kind == "launchd" else None

    def state(self) -> str:
        """The state directory the units use, as the CLI should be told it."""
        literal = self.literal_state()
        return SYSTEMD_SYSTEM_STATE if literal is None else str(literal)


def default_dest(kind: Kind, user: bool) -> Path:
    if kind == "systemd":
        return Path.home() / ".config/systemd/user" if user else Path("/etc/systemd/system")
    return Path.home() / "Library/LaunchAgents" if user else Path("/Library/LaunchDaemons")


def names(kind: Kind) -> list[str]:
    if kind == "systemd":
        return [*(p.unit for p in PROCESSES), *HELPERS, TARGET]
    return [p.plist for p in PROCESSES]


def committed(kind: Kind, name: str) -> bytes:
    """A committed unit file, as shipped in the package."""
    return (resources.files("sensorium.deploy") / kind / name).read_bytes()


def render(opts: Options) -> dict[str, bytes]:
    """Every file of ``opts.kind``, by file name, rewritten for ``opts``."""
    check_paths(opts)
    if opts.kind == "systemd":
        return {
            n: render_systemd(n, committed("systemd", n).decode(), opts) for n in names("systemd")
        }
    return {p.plist: render_launchd(p, committed("launchd", p.plist), opts) for p in PROCESSES}


def check_paths(opts: Options) -> None:
    """Refuse what a unit cannot carry, and a state dir whose sockets would not fit."""
    for arg in (*opts.launcher.argv(PROCESSES[0]), opts.state()):
        if any(ord(c) < 32 or c == "\x7f" for c in arg):
            raise ValueError(f"a path with a control character cannot go into a unit: {arg!r}")
    if opts.literal_state() is not None:
        StatePaths(Path(opts.state())).ipc("connector")  # StatePathError when too long


# -- systemd -------------------------------------------------------------------------


def quote(arg: str, *, env: bool = True) -> str:
    """One word of a systemd command line or path list: specifiers (and $VARS) escaped."""
    out = arg.replace("%", "%%")
    if env:
        out = out.replace("$", "$$")
    if out and not any(c.isspace() or c in "\"'\\;" for c in out):
        return out
    return '"' + out.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def render_systemd(name: str, template: str, opts: Options) -> bytes:
    """One unit: the committed text with its directives rewritten, comments kept with
    the directive they explain (and left out with it)."""
    process = next((p for p in PROCESSES if p.unit == name), None)
    reached = _reached(opts)
    confined = "ProtectSystem=" in template
    out = _header(opts)
    pending: list[str] = []
    for line in template.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(line)
            continue
        if not stripped or stripped.startswith("["):
            out += [*pending, line]
            pending = []
            continue
        key, _, value = line.partition("=")
        kept = _directive(key.strip(), value.strip(), process, opts, confined, reached)
        if kept and kept[0].startswith("#"):
            out += kept  # the directive comes with its own explanation
        elif kept:
            out += [*pending, *kept]
        pending = []
    out += pending
    return ("\n".join(out) + "\n").encode()


def _reached(opts: Options) -> list[str]:
    """Paths the units open, as the kernel finds them (symlinks resolved): the program,
    the package it imports, the state directory."""
    paths = [opts.launcher.argv(PROCESSES[0])[0], str(opts.launcher.package_dir)]
    literal = opts.literal_state()
    if literal is not None:
        paths.append(str(literal))
    return [p for path in paths for p in dict.fromkeys((path, str(Path(path).resolve())))]


def _directive(
    key: str,
    value: str,
    process: Process | None,
    opts: Options,
    confined: bool,
    reached: list[str],
) -> list[str]:
    """What one committed directive becomes: [] leaves it out; a first line that is a
    comment replaces the comment above it."""
    if opts.user and key in SYSTEM_ONLY:
        return []
    if key == "ExecStart" and process is None:
        return [f"{key}={value}"]  # a helper unit's own command (sensorium.target's waits)
    if key == "ExecStart":
        assert process is not None
        expected = f"{DEFAULT_BIN}/{process.script} --state-dir {SYSTEMD_STATE}"
        if value != expected:
            raise ValueError(f"{process.unit}: ExecStart= is not {expected!r}: {value!r}")
        literal = opts.literal_state()
        state = SYSTEMD_STATE if literal is None else quote(str(literal))
        argv = " ".join(quote(a) for a in opts.launcher.argv(process))
        return [f"ExecStart={argv} --state-dir {state}"]
    literal = opts.literal_state()
    if key in ("StateDirectory", "StateDirectoryMode") and literal is not None:
        # StateDirectory= names only a directory under %S.
        if key == "StateDirectory" and confined and not opts.user:
            return [
                "# The state directory, shared by all three units.",
                f"ReadWritePaths={quote(str(literal), env=False)}",
            ]
        return []
    if key == "ProtectHome" and any(_under(p, HOME_DIRS) for p in reached):
        return ["ProtectHome=read-only"]
    if key == "PrivateTmp" and any(_under(p, TMP_DIRS) for p in reached):
        return []
    if key == "ExecStop" and opts.user and value.startswith("systemctl "):
        return [f"ExecStop=systemctl --user {value.removeprefix('systemctl ')}"]
    if key == "WantedBy" and opts.user:
        return [f"WantedBy={value.replace('multi-user.target', 'default.target')}"]
    return [f"{key}={value}"]


def _header(opts: Options) -> list[str]:
    flavor = "--systemd --user" if opts.user else "--systemd"
    lines = [
        f"# Written by `sensorium install-units {flavor}` for this installation:",
        f"#   {opts.launcher.describe()}; state directory {opts.state()}.",
        "# Change it with a drop-in (`systemctl edit`); install-units replaces this file",
        "# only with --force.",
    ]
    if opts.user:
        lines += [
            "# A user unit: options that need a mount namespace or capabilities are left",
            "# out (a user manager gets them only from an unprivileged user namespace).",
        ]
    return [*lines, "#"]


# -- launchd -------------------------------------------------------------------------


def render_launchd(process: Process, template: bytes, opts: Options) -> bytes:
    job: dict[str, Any] = plistlib.loads(template)
    expected = [f"{DEFAULT_BIN}/{process.script}", "--state-dir", LAUNCHD_STATE]
    if job.get("ProgramArguments") != expected:
        raise ValueError(f"{process.plist}: ProgramArguments is not {expected}")
    state = opts.state()
    job["ProgramArguments"] = [*opts.launcher.argv(process), "--state-dir", state]
    job["StandardErrorPath"] = f"{state}/logs/{process.log_name}.stderr"
    return plistlib.dumps(job, sort_keys=False)
