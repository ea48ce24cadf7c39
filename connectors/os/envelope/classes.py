"""Load-time rules of each action class beyond the schema: what its envelope needs declared.

A declaration that breaks one is rejected with the catalog (no partial catalog);
what depends on this node rather than on the text (is overlayfs here?) is a
ledger state, decided by the probe, not a load error.
"""

from __future__ import annotations

from collections.abc import Iterator

from sensorium.connectors.os.effects.fswrite import check_write_root
from sensorium.connectors.os.envelope.argv import placeholders
from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.shared import patterns
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.fs_policy import FsPolicy

Problem = tuple[str, str]


# Every action's /tmp is its own scratch tmpfs: the host's /tmp is not visible to it.
PRIVATE_TMP = "/tmp"


def _in_private_tmp(path: str) -> bool:
    return path == PRIVATE_TMP or path.startswith(PRIVATE_TMP + "/")


def _host_paths(decl: Declaration) -> Iterator[tuple[str, str]]:
    yield "executable.path", decl.executable.path
    if decl.executable.interpreter:
        yield "executable.interpreter", decl.executable.interpreter
    if decl.script is not None:
        for i, root in enumerate(decl.script.allowed_roots):
            yield f"script.allowed_roots[{i}]", root
    if decl.fs_write is not None:
        yield "fs_write.write_root", decl.fs_write.write_root


def check_class(decl: Declaration, policy: FsPolicy | None) -> Iterator[Problem]:
    for field_path, path in _host_paths(decl):
        if _in_private_tmp(path):
            yield (
                field_path,
                f"{path} is under /tmp, which every action sees as its own empty scratch; "
                "put it elsewhere (e.g. /var/lib or /opt)",
            )
    if policy is not None:
        try:
            fsprofile.effective_profile(policy, decl.fs_profile)
        except fsprofile.PolicyError as exc:
            yield "fs_profile", "; ".join(m for _, m in exc.problems)
    # A script runs the C2 way in every class (a root it is opened beneath, no links,
    # its bytes sealed): only C2 and C6 also take parameters as --params-json alone.
    if decl.class_ == "allowlisted-script" or decl.executable.kind == "script":
        yield from _script(
            decl, params_json=decl.class_ in ("allowlisted-script", "composed-spawn")
        )
    if decl.fs_write is not None:
        yield from _fs_write(decl)


def _script(decl: Declaration, *, params_json: bool) -> Iterator[Problem]:
    exe = decl.executable
    if exe.kind != "script":
        yield "executable.kind", 'allowlisted-script runs a script: kind must be "script"'
    if exe.interpreter is None:
        yield (
            "executable.interpreter",
            "a script names its interpreter by absolute path; the script's own "
            "#! line is not followed",
        )
    if decl.script is None:
        yield (
            "script.allowed_roots",
            "a script is opened beneath an allowlisted root: declare script.allowed_roots",
        )
    else:
        roots = [r.rstrip("/") + "/" for r in decl.script.allowed_roots]
        if not any(exe.path.startswith(r) for r in roots):
            yield "executable.path", f"{exe.path} is not beneath any of script.allowed_roots"
        if any(part in ("..", ".") for part in exe.path.split("/")):
            yield "executable.path", "the script path must not contain . or .. segments"
    shape = exe.argv_shape
    if shape.count(exe.path) != 1:
        yield (
            "executable.argv_shape",
            f"must name the script path {exe.path} exactly once, as its own element",
        )
    if not params_json:
        return
    for i, element in enumerate(shape):
        names = placeholders(element)
        if any(n != "params_json" for n in names):
            yield (
                f"executable.argv_shape[{i}]",
                "an allowlisted script takes its parameters only as --params-json {{params_json}}",
            )
        if names and (element != "{{params_json}}" or i == 0 or shape[i - 1] != "--params-json"):
            yield (
                f"executable.argv_shape[{i}]",
                'write the parameters as the pair "--params-json", "{{params_json}}"',
            )


def _fs_write(decl: Declaration) -> Iterator[Problem]:
    assert decl.fs_write is not None
    problem = check_write_root(decl.fs_write.write_root)
    if problem is not None:
        yield "fs_write.write_root", problem
    if decl.fs_write.max_bytes_per_file > decl.fs_write.max_bytes_total:
        yield "fs_write.max_bytes_per_file", "exceeds fs_write.max_bytes_total"
    path_pattern = decl.fs_write.path_pattern
    if path_pattern is not None and (why := patterns.problem(path_pattern)) is not None:
        yield "fs_write.path_pattern", why


# What each class may do; the envelope adds one mechanism per effect, so an effect
# not named gets none. Here, where the builder and the effects settled after a run
# both read it, so neither imports the other for it.
CLASS_EFFECTS: dict[str, tuple[str, ...]] = {
    "read-only-spawn": ("read",),
    "allowlisted-script": ("read",),
    "scoped-fs-write": ("read", "scoped-fs-write"),
    "egress-network-spawn": ("read", "egress-network"),
    "artifact-producing-spawn": ("read", "artifact-produce"),
}
EFFECT_CLASS = {
    "scoped-fs-write": "scoped-fs-write",
    "egress-network": "egress-network-spawn",
    "artifact-produce": "artifact-producing-spawn",
}


def effects(decl: Declaration) -> tuple[str, ...]:
    if decl.class_ == "composed-spawn" and decl.composed is not None:
        return ("read", *(e for e in decl.composed.effects if e != "read"))
    return CLASS_EFFECTS.get(decl.class_, ("read",))
