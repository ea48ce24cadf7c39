"""The action catalog: factory defaults materialized, sources merged, declarations validated
(each by ``validation.py``).

A catalog with any invalid declaration is refused whole — a silently dropped
action is a harder operator failure than a refusing module (seed 048).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from sensorium.connectors.os.catalog.interpreters import InterpreterPin

# One rule's failure and the rules themselves (validation.py): callers know them as the catalog's.
from sensorium.connectors.os.catalog.validation import Problem as Problem
from sensorium.connectors.os.catalog.validation import executable_gap as executable_gap
from sensorium.connectors.os.catalog.validation import validate_declaration as validate_declaration
from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.shared.canonical import sha256_hex
from sensorium.shared.files import read_regular
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import ConnectorConfig, Declaration
from sensorium.shared.wire.fs_policy import FsPolicy

MODULE_ID = "sensorium-os"
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # one source file
# Caps on the whole catalog, so that loading it stays bounded (validation costs about a
# millisecond per declaration) and its problems, all sent to core in one module report,
# fit one 4 MiB reply whatever the files say.
MAX_CATALOG_BYTES = 8 * 1024 * 1024  # the operator file and every drop-in together
MAX_DECLARATIONS = 4096
MAX_PROBLEMS = 100
MAX_PROBLEM_CHARS = 500


@dataclass
class Catalog:
    """The effective configuration and what came of validating it."""

    config: dict[str, Any]
    config_hash: str
    allow_unsigned_bootstrap: bool
    declarations: dict[str, Declaration] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    materialized: bool = False
    policy: FsPolicy = field(default_factory=lambda: fsprofile.load_policy(None))
    # What each `"interpreter": "/usr/bin/env"` resolved to at load, by action id.
    pins: dict[str, InterpreterPin] = field(default_factory=dict)

    @property
    def pristine(self) -> bool:
        """Byte-for-byte the factory defaults: no operator edit, overlay or drop-in."""
        return bool(self.config_hash) and self.config_hash == factory_hash()

    @property
    def valid(self) -> bool:
        return not self.problems

    def __repr__(self) -> str:
        return (
            f"<Catalog hash={self.config_hash[:12]} actions={len(self.declarations)} "
            f"problems={len(self.problems)}>"
        )


def factory_text() -> bytes:
    return (
        resources.files("sensorium.connectors.os")
        .joinpath(f"factory/{MODULE_ID}.json")
        .read_bytes()
    )


def operator_file(paths: StatePaths) -> Path:
    return paths.connectors_config / f"{MODULE_ID}.json"


def dropin_dir(paths: StatePaths) -> Path:
    return paths.connectors_config / f"{MODULE_ID}.d"


def materialize(paths: StatePaths) -> bool:
    """Copy the factory defaults into the active config area if absent; True if it did."""
    target = operator_file(paths)
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".json.tmp")
    tmp.write_bytes(factory_text())
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    dropin_dir(paths).mkdir(exist_ok=True)
    return True


def _read_source(path: Path, problems: list[Problem]) -> bytes | None:
    try:
        return read_regular(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        problems.append(Problem(str(path), None, "$", f"cannot read: {exc.strerror or exc}"))
        return None


def source_files(paths: StatePaths) -> list[Path]:
    """The operator file, then the drop-ins in name order: the merge order."""
    files = [operator_file(paths)]
    ddir = dropin_dir(paths)
    if ddir.is_dir():
        files += sorted(p for p in ddir.iterdir() if p.suffix == ".json" and p.is_file())
    return files


def load(paths: StatePaths, *, materialize_defaults: bool = True, validate: bool = True) -> Catalog:
    """Materialize (first run), merge the operator file and drop-ins, and validate."""
    materialized = materialize(paths) if materialize_defaults else False
    problems: list[Problem] = []
    sources: list[tuple[str, bytes]] = []
    if not operator_file(paths).exists():
        # Not materialized yet: the effective configuration is what the first start will
        # materialize, so a review before the first start sees what will run.
        sources.append((str(operator_file(paths)), factory_text()))
    total = sum(len(raw) for _, raw in sources)
    for path in source_files(paths):
        if not path.exists():
            continue
        raw = _read_source(path, problems)
        if raw is None:
            continue
        total += len(raw)
        if total > MAX_CATALOG_BYTES:
            why = f"the catalog sources together pass {MAX_CATALOG_BYTES} bytes at this file"
            problems.append(Problem(str(path), None, "$", f"{why}; merge or remove drop-ins"))
            break
        sources.append((str(path), raw))
    catalog = merge(sources, problems, validate=validate)
    catalog.materialized = materialized
    return catalog


def factory_hash() -> str:
    """The effective-configuration hash of the untouched factory defaults."""
    return merge([("factory", factory_text())], []).config_hash


def merge(
    sources: list[tuple[str, bytes]], problems: list[Problem], *, validate: bool = True
) -> Catalog:
    """Merge sources in order (a later declaration replaces an earlier one whole; fs
    policies are layered, see :func:`layer_policies`) and validate (``validate=False``:
    only the effective configuration and its hash)."""
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    allow_unsigned = False
    policies: list[tuple[str, dict[str, Any]]] = []
    for name, raw in sources:
        try:
            cfg: dict[str, Any] = msgspec.to_builtins(
                msgspec.json.decode(raw, type=ConnectorConfig)
            )
        except msgspec.DecodeError as exc:
            problems.append(Problem(name, None, "$", str(exc)))
            continue
        except UnicodeDecodeError as exc:  # msgspec's own error for bytes that are not UTF-8
            problems.append(Problem(name, None, "$", f"is not UTF-8 text: {exc}"))
            continue
        except RecursionError:
            problems.append(Problem(name, None, "$", "nested too deeply to be a catalog"))
            continue
        allow_unsigned = allow_unsigned or bool(cfg.get("allow_unsigned_bootstrap"))
        if cfg.get("policy") is not None:
            policies.append((name, cfg["policy"]))
        seen: set[str] = set()
        for i, entry in enumerate(cfg.get("action_catalog", [])):
            aid = entry.get("action_id") if isinstance(entry, dict) else None
            if not isinstance(aid, str):
                problems.append(
                    Problem(
                        name,
                        None,
                        f"action_catalog[{i}].action_id",
                        "every declaration needs a string action_id",
                    )
                )
                continue
            if aid in seen:
                problems.append(
                    Problem(
                        name,
                        aid,
                        f"action_catalog[{i}].action_id",
                        "duplicate action_id in the same file",
                    )
                )
                continue
            seen.add(aid)
            merged[aid] = entry
            origin[aid] = name
    effective = {
        "schema": "sensorium-os-config.v1",
        "allow_unsigned_bootstrap": allow_unsigned,
        "action_catalog": [merged[k] for k in sorted(merged)],
    }
    layered = layer_policies([p for _, p in policies]) if policies else None
    if layered is not None:
        effective["policy"] = layered
    try:
        config_hash = sha256_hex(effective)
    except (ValueError, TypeError) as exc:
        # RFC 8785 rejects what I-JSON cannot carry (integers beyond 2**53, say).
        problems.append(
            Problem("effective configuration", None, "$", f"has no canonical JSON form: {exc}")
        )
        config_hash = ""
    catalog = Catalog(
        config=effective,
        config_hash=config_hash,
        allow_unsigned_bootstrap=allow_unsigned,
        sources=origin,
        problems=problems,
    )
    if layered is not None and validate:
        _load_policy(catalog, policies, layered)
    if validate and len(merged) > MAX_DECLARATIONS:
        why = f"{len(merged)} declarations; a catalog holds at most {MAX_DECLARATIONS}"
        problems.append(Problem("effective configuration", None, "action_catalog", why))
    for aid in sorted(merged) if validate and len(merged) <= MAX_DECLARATIONS else ():
        try:
            decl = validate_declaration(
                merged[aid],
                origin[aid],
                problems,
                catalog.policy,
                connector_id=MODULE_ID,
                pins=catalog.pins,
            )
        except RecursionError:
            problems.append(Problem(origin[aid], aid, "$", "nested too deeply to be a declaration"))
            continue
        if decl is not None:
            catalog.declarations[aid] = decl
    _bound(problems)
    return catalog


def layer_policies(policies: list[dict[str, Any]]) -> dict[str, Any]:
    """The fs policies of every source as one (policy ADR-002), in merge order: a later
    source's profile replaces an earlier profile of the same name; the global denies
    (``denyRead``, ``denyModify``) accumulate over every source, so a drop-in can add a
    profile or a deny but never take the operator's denies away. One source's policy is
    taken as written (so its hash is what it always was)."""
    if len(policies) == 1:
        return policies[0]
    layered: dict[str, Any] = {"schemaVersion": policies[-1].get("schemaVersion")}
    for policy in policies:
        profiles = policy.get("fsProfiles")
        if isinstance(profiles, dict):
            layered.setdefault("fsProfiles", {}).update(profiles)
        for key in ("denyRead", "denyModify"):
            rules = policy.get(key)
            if isinstance(rules, list):
                have = layered.setdefault(key, [])
                have += [r for r in rules if r not in have]
    return layered


def _load_policy(
    catalog: Catalog, policies: list[tuple[str, dict[str, Any]]], layered: dict[str, Any]
) -> None:
    """Check each source's policy (its problems name its file), then the layered one."""

    def load(name: str, policy: dict[str, Any]) -> FsPolicy | None:
        try:
            return fsprofile.load_policy(policy)
        except fsprofile.PolicyError as exc:
            for where, message in exc.problems:
                field_path = "policy" + where.removeprefix("$")
                catalog.problems.append(Problem(name, None, field_path, message))
            return None

    each = [load(name, policy) for name, policy in policies]
    if any(p is None for p in each):
        return
    loaded = each[0] if len(policies) == 1 else load("effective configuration", layered)
    if loaded is not None:
        catalog.policy = loaded


def _bound(problems: list[Problem]) -> None:
    """At most MAX_PROBLEMS problems of at most MAX_PROBLEM_CHARS per text, in place: a
    schema error quotes the offending value, which may be megabytes long."""

    def cut(text: str) -> str:
        return text if len(text) <= MAX_PROBLEM_CHARS else text[: MAX_PROBLEM_CHARS - 1] + "…"

    extra = len(problems) - MAX_PROBLEMS
    del problems[MAX_PROBLEMS:]
    for i, p in enumerate(problems):
        aid = None if p.action_id is None else cut(p.action_id)
        problems[i] = Problem(p.source, aid, cut(p.field), cut(p.message), p.code)
    if extra > 0:
        problems.append(Problem("catalog", None, "$", f"and {extra} more problems"))
