"""The platform switch, and the macOS backend: ``sandbox-exec -f <profile>`` around the argv.

:func:`backend` picks by ``sys.platform``: ``linux`` keeps the namespace/Landlock path
as it is, ``darwin`` runs the action under a sandbox profile compiled from the same
resolved fs profile (:mod:`.sbpl`), anything else refuses every action as
``unsupported_by_runtime``. :func:`wrap` is pure (argv and profile text in, argv and
files out), so the wrapping is tested on Linux.

A macOS node refuses what it cannot enforce, as the Linux tiers do. Linux mechanisms
with no macOS equivalent here, and what follows from their absence:

* mount, pid, network, ipc and uts namespaces: no private ``/tmp``, no masking mounts,
  no hiding of other processes (SBPL's ``(signal (target self))`` keeps the action's
  signals to itself); so C3 ``scoped-fs-write`` (overlay with a capped upper layer,
  inspected before commit) and C5 ``artifact-producing-spawn`` (capped tmpfs) are
  refused, and C4 ``egress-network-spawn`` is refused until the relay has a macOS
  front end: on Linux it learns each destination from listeners inside the action's
  network namespace and binds ``/etc/hosts``, neither of which exists here;
* user namespaces and uid drop without root: the action runs as the connector's user;
* seccomp: no syscall filter; SBPL's default deny covers the operations it names;
* sealed memfd and exec from a pinned fd (``fexecve``): a script or a sha256-pinned
  binary would be checked, then read or exec'd again by path, so both are refused;
* RLIMIT_NPROC is per user, not per action, and RLIMIT_DATA/RLIMIT_AS are not
  enforced by the macOS kernel: the per-action limits are those the launcher applies
  (time, output caps), and that is named in the ledger as a gap.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.connectors.os.run.sandbox.sbpl import SbplError, SbplInput, compile_sbpl
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy
from sensorium.shared.wire.report import LedgerState

if TYPE_CHECKING:
    from sensorium.connectors.os.envelope.prepared import Prepared
    from sensorium.connectors.os.run.spawning import SpawnSpec

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
PROFILE_NAME = "profile.sb"
# A scratch path of the shape a run gets (under the host's temporary directory).
SCRATCH_SAMPLE = "/private/tmp/sensorium-scratch"
Backend = Literal["linux", "darwin"]
# The classes a sandbox profile alone enforces whole (as the Landlock tier's).
DARWIN_CLASSES = ("read-only-spawn",)
# What the launcher cannot bound per action on macOS; said with every enabled action.
DARWIN_GAPS = (
    "macOS: no pid namespace, no seccomp filter, no per-action RLIMIT_NPROC or memory "
    "cap; the action runs as the connector's user under its sandbox profile",
)
_NEEDS = {
    "allowlisted-script": "a sealed copy of the script (memfd), which macOS has not",
    "scoped-fs-write": "an overlay with a capped upper layer, which macOS has not",
    "artifact-producing-spawn": "a capped tmpfs for its artifacts, which macOS has not",
    "egress-network-spawn": "the relay's network-namespace listeners, which macOS has not",
    "composed-spawn": "the mechanisms of the classes it composes",
}


class Unsupported(Exception):
    """This platform has no backend; ``reason`` says so for the ledger."""

    def __init__(self, platform: str) -> None:
        self.reason = (
            f"platform {platform!r} has no sandbox backend (only linux and darwin): "
            "no action runs unenforced here"
        )
        super().__init__(self.reason)


def backend(platform: str = sys.platform) -> Backend:
    """The sandbox backend for ``platform``; raises :class:`Unsupported` for the others.

    >>> backend("linux"), backend("darwin")
    ('linux', 'darwin')
    """
    if platform.startswith("linux"):
        return "linux"
    if platform == "darwin":
        return "darwin"
    raise Unsupported(platform)


def platform_state(
    decl: Declaration, policy: FsPolicy, platform: str = sys.platform
) -> tuple[LedgerState, list[str]] | None:
    """``None`` on Linux (its own tiers decide); else what this platform gives ``decl``.

    On macOS the profile is compiled here once, so a rule SBPL cannot write exactly
    refuses the action in the ledger, not at its first spawn."""
    try:
        if backend(platform) == "linux":
            return None
    except Unsupported as exc:
        return "unsupported_by_runtime", [exc.reason]
    if decl.class_ not in DARWIN_CLASSES:
        need = _NEEDS.get(decl.class_, "namespaces")
        return "unsupported_by_runtime", [f"macOS: class {decl.class_} needs {need}"]
    if decl.executable.kind == "script" or decl.executable.sha256 is not None:
        why = "a pinned program would be exec'd by path after its check (no fexecve)"
        return "unsupported_by_runtime", [f"macOS: {why}"]
    try:
        profile_text(decl, policy, SCRATCH_SAMPLE)
    except fsprofile.PolicyError as exc:
        return "blocked_by_policy", [str(exc)]
    except SbplError as exc:
        return "unsupported_by_runtime", [str(exc)]
    return "enabled", list(DARWIN_GAPS)


def sbpl_input(decl: Declaration, policy: FsPolicy, scratch: str) -> SbplInput:
    """The sandbox of one read-only action, resolved the way the Linux envelope does:
    the declaration's fs profile (global denies appended), './' rules at its scratch."""
    profile = fsprofile.effective_profile(policy, decl.fs_profile)
    executable = decl.executable.interpreter or decl.executable.path
    return SbplInput(profile=profile, base=scratch, executable=executable, full=(scratch,))


def profile_text(decl: Declaration, policy: FsPolicy, scratch: str) -> str:
    """The SBPL of ``decl``; raises SbplError (refuse) or fsprofile.PolicyError."""
    return compile_sbpl(sbpl_input(decl, policy, scratch))


@dataclass(frozen=True)
class Wrapped:
    """What to exec and the files to write (mode 0400) before exec'ing it."""

    executable: str
    argv: list[str]
    files: dict[str, str]


def wrap(argv: list[str], executable: str, profile: str, run_dir: str) -> Wrapped:
    """``argv`` run by ``sandbox-exec -f <run_dir>/profile.sb``; pure, no I/O.

    sandbox-exec execs its first operand by path, so the program is named by its
    absolute path and argv[0] is not kept (macOS has no exec-with-argv0 for it).

    >>> w = wrap(["ls", "-la", "--", "/x"], "/bin/ls", "(version 1)\\n", "/r")
    >>> w.argv
    ['sandbox-exec', '-f', '/r/profile.sb', '--', '/bin/ls', '-la', '--', '/x']
    """
    if not (os.path.isabs(executable) and os.path.isabs(run_dir)):
        raise SbplError("sandbox-exec", "the program and the run directory must be absolute")
    if not argv:
        raise SbplError("sandbox-exec", "an empty argv names no program")
    path = os.path.join(run_dir, PROFILE_NAME)
    # '--' so an argv that starts with '-' is never read as sandbox-exec's own option.
    wrapped = ["sandbox-exec", "-f", path, "--", executable, *argv[1:]]
    return Wrapped(executable=SANDBOX_EXEC, argv=wrapped, files={path: profile})


def prepare(
    decl: Declaration,
    parameters: dict[str, object],
    policy: FsPolicy,
    run_dir: Path,
    make_spec: Callable[[Declaration, list[str], str, float, str], SpawnSpec],
    timeout_s: float,
) -> Prepared:
    """One macOS run: a fresh scratch, the profile written beside it (outside every
    area the action may write), the spec aimed at sandbox-exec. Raises RenderError,
    SbplError, PolicyError or OSError, as the Linux envelope does; nothing is left."""
    from sensorium.connectors.os.envelope.prepared import Prepared
    from sensorium.connectors.os.envelope.render import render

    scratch = os.path.realpath(tempfile.mkdtemp(prefix="sensorium-scratch-"))
    prepared = Prepared(spec=None, argv=[], sandbox=None, host_dirs=[Path(scratch)])  # type: ignore[arg-type]
    try:
        argv = render(decl.executable.argv_shape, parameters, {"scratch": scratch})
        spec = sbpl_input(decl, policy, scratch)
        wrapped = wrap(argv, spec.executable, compile_sbpl(spec), str(run_dir))
        run_dir.mkdir(mode=0o700, parents=True)
        prepared.host_dirs.append(run_dir)
        for path, text in wrapped.files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(text)
        prepared.argv = argv
        prepared.spec = make_spec(decl, wrapped.argv, scratch, timeout_s, wrapped.executable)
    except BaseException:
        prepared.cleanup()
        raise
    return prepared
