"""The macOS backend on Linux: SBPL goldens, the glob->ERE translation against the
project's own matcher, exact escaping and refusals, and the pure sandbox-exec wrapping.

Regenerate the goldens with ``UPDATE_GOLDEN=1`` (then read the diff before committing).
"""

from __future__ import annotations

import doctest
import json
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sensorium.connectors.os.run.sandbox import darwin, fsprofile, sbpl
from sensorium.connectors.os.run.sandbox.sbpl import SbplError, SbplInput, compile_sbpl, glob_to_ere
from sensorium.shared.wire.declaration import Declaration

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sbpl"
FACTORY = (
    Path(__file__).resolve().parents[2] / "connectors" / "os" / "factory" / "sensorium-os.json"
)
SCRATCH = darwin.SCRATCH_SAMPLE
EXE = "/bin/ls"

# One per profile shape of the policy seed (ADR-002..005, ADR-011/012).
SHAPES: dict[str, tuple[dict[str, Any], str | None, dict[str, Any]]] = {
    "subtree-deny": (
        {"fsProfiles": {"tools": {"read": ["/usr/**", "/opt/tools/**", "!/opt/tools/keys/**"]}}},
        "tools",
        {},
    ),
    "glob-deny": ({"denyRead": ["**/*.env", "**/*.secret"]}, None, {}),
    "read-only": (
        {"fsProfiles": {"ro": {"read": ["/usr/**", "/srv/data/**", "/etc/hosts"], "modify": []}}},
        "ro",
        {},
    ),
    "scoped-write": (
        {
            "fsProfiles": {
                "build": {
                    "read": ["/usr/**", "./**"],
                    "modify": ["./build/**", "!./build/keep/**"],
                }
            },
            "denyModify": ["**/*.lock"],
        },
        "build",
        {"base": "/srv/project", "write_root": "/srv/project"},
    ),
    "unrestricted-implicit": ({}, None, {}),
    "global-denies-accumulate": (
        {
            "fsProfiles": {"team": {"read": ["/**", "!/home/*/.ssh/**"], "modify": ["./**"]}},
            "denyRead": ["/root/**", "/etc/shadow", "**/*.env"],
            "denyModify": ["/etc/**", "**/.git/**"],
        },
        "team",
        {"write_root": SCRATCH + "/out", "base": SCRATCH + "/out"},
    ),
    "egress-relay": (
        {"denyRead": ["/root/**"]},
        None,
        {"relay_ports": (40001, 40002), "relay_sockets": ("/private/var/run/sensorium/r.sock",)},
    ),
}


def _shape(name: str) -> str:
    raw, profile_name, extra = SHAPES[name]
    policy = fsprofile.load_policy({"schemaVersion": 2, **raw})
    kwargs: dict[str, Any] = {"base": SCRATCH, "executable": EXE, "full": (SCRATCH,), **extra}
    return compile_sbpl(
        SbplInput(profile=fsprofile.effective_profile(policy, profile_name), **kwargs)
    )


def _factory() -> list[tuple[Declaration, dict[str, Any] | None]]:
    doc = json.loads(FACTORY.read_text())
    return [(msgspec.convert(e, Declaration), doc.get("policy")) for e in doc["action_catalog"]]


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.sb"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name}: SBPL differs from {path} (UPDATE_GOLDEN=1)"


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_seed_shape_matches_its_golden(name: str) -> None:
    _check_golden(name, _shape(name))


@pytest.mark.parametrize("index", range(len(_factory())))
def test_every_factory_action_matches_its_golden(index: int) -> None:
    decl, raw = _factory()[index]
    assert darwin.platform_state(decl, fsprofile.load_policy(raw), "darwin") == (
        "enabled",
        list(darwin.DARWIN_GAPS),
    )
    _check_golden(
        f"factory-{decl.action_id}", darwin.profile_text(decl, fsprofile.load_policy(raw), SCRATCH)
    )


def test_no_golden_is_stale() -> None:
    names = {f"{n}.sb" for n in SHAPES} | {f"factory-{d.action_id}.sb" for d, _ in _factory()}
    assert {p.name for p in GOLDEN.glob("*.sb")} == names


# --- a tiny evaluator of the SBPL subset we emit: filtered rules, last match wins -------

_TOKEN = re.compile(r'#"([^"]*)"|"((?:[^"\\]|\\.)*)"|([()])|([^\s()"]+)')


def _parse(text: str) -> list[Any]:
    stack: list[list[Any]] = [[]]
    for regex, string, paren, atom in _TOKEN.findall(text):
        if paren == "(":
            stack.append([])
        elif paren == ")":
            done = stack.pop()
            stack[-1].append(done)
        elif regex or (not string and not atom):
            stack[-1].append(("regex", regex))
        elif string or atom.startswith('"'):
            stack[-1].append(("str", re.sub(r"\\(.)", r"\1", string)))
        else:
            stack[-1].append(atom)
    return stack[0]


def _filter_matches(f: list[Any], path: str) -> bool:
    head, *args = f
    if head == "require-any":
        return any(_filter_matches(a, path) for a in args)
    if head == "require-all":
        return all(_filter_matches(a, path) for a in args)
    ((kind, value),) = args
    if head == "literal":
        return bool(path == value)
    if head == "subpath":
        return bool(path == value or path.startswith(value.rstrip("/") + "/"))
    assert head == "regex" and kind == "regex"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # '[[]' is literal '[' in ERE too
        return re.search(value, path) is not None


def _decide(text: str, op: str, path: str) -> bool:
    """The decision for ``op`` on ``path`` by the path-filtered rules of ``text``."""
    allowed = False
    for form in _parse(text):
        if not (isinstance(form, list) and form and form[0] in ("allow", "deny")):
            continue
        ops = [x for x in form[1:] if isinstance(x, str)]
        filters = [x for x in form[1:] if isinstance(x, list)]
        if op in ops and filters and any(_filter_matches(f, path) for f in filters):
            allowed = form[0] == "allow"
    return allowed


# --- the translation agrees with the project's matcher --------------------------------

SEGMENT_CHARS = "ab.+()[]{}|$-_ "
segment = st.text(alphabet=SEGMENT_CHARS, min_size=1, max_size=4).filter(
    lambda s: s not in (".", "..")
)
glob_segment = st.one_of(
    segment,
    st.just("**"),
    st.text(alphabet=SEGMENT_CHARS + "*?", min_size=1, max_size=5).filter(
        lambda s: s not in (".", "..")
    ),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(glob_segment, min_size=1, max_size=5),
    st.lists(st.lists(segment, min_size=0, max_size=6), min_size=1, max_size=8),
)
def test_glob_to_ere_agrees_with_fsprofile(
    pattern_segments: list[str], paths: list[list[str]]
) -> None:
    pattern = "/" + "/".join(pattern_segments)
    ere = glob_to_ere(pattern)
    for parts in paths:
        path = "/" + "/".join(parts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ours = re.fullmatch(ere, path) is not None
        assert ours == fsprofile._matches(pattern, path), (pattern, ere, path)


@st.composite
def _pattern_and_near_paths(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A pattern, and paths made from it (so most match, and some barely do not)."""
    segments = draw(st.lists(glob_segment, min_size=1, max_size=5))
    paths = []
    for _ in range(6):
        parts: list[str] = []
        for seg in segments:
            if seg == "**":
                parts += draw(st.lists(segment, max_size=2))
                continue
            text = "".join(
                draw(st.text(alphabet=SEGMENT_CHARS, max_size=2))
                if c == "*"
                else draw(st.sampled_from(SEGMENT_CHARS))
                if c == "?"
                else c
                for c in seg
            )
            if draw(st.integers(0, 5)) == 0:  # a near miss
                text += draw(st.sampled_from(["/", ".", "*", "x"]))
            parts.append(text)
        path = "/" + "/".join(p for p in parts if p)
        paths.append(os.path.normpath(path) if path != "/" else path)
    return "/" + "/".join(segments), paths


@settings(max_examples=600, deadline=None)
@given(_pattern_and_near_paths())
def test_glob_to_ere_agrees_on_paths_made_from_the_pattern(case: tuple[str, list[str]]) -> None:
    pattern, paths = case
    ere = glob_to_ere(pattern)
    for path in paths:
        if path.startswith("//") or "/../" in path + "/" or "/./" in path + "/":
            continue  # not a normalized path: fsprofile refuses those
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ours = re.fullmatch(ere, path) is not None
        assert ours == fsprofile._matches(pattern, path), (pattern, ere, path)


CASES = [
    ("/**/*.env", ["/a/.env", "/x.env", "/a/b/c.env"], ["/a/.env/x", "/a/env", "/a.envx"]),
    ("/**/*.secret", ["/s/k.secret"], ["/s/k.secret.bak", "/s/k.secret/x"]),
    ("/home/*/.ssh/**", ["/home/u/.ssh", "/home/u/.ssh/id"], ["/home/.ssh", "/home/u/v/.ssh"]),
    ("/a.b/c?d", ["/a.b/cxd"], ["/axb/cxd", "/a.b/cd", "/a.b/c/d"]),
    ("/**", ["/", "/a", "/a/b"], []),
    ("/a/**/b", ["/a/b", "/a/x/y/b"], ["/a/xb", "/a/b/c"]),
]


@pytest.mark.parametrize(("pattern", "yes", "no"), CASES)
def test_known_globs(pattern: str, yes: list[str], no: list[str]) -> None:
    ere = glob_to_ere(pattern)
    for path in yes:
        assert re.fullmatch(ere, path) and fsprofile._matches(pattern, path), path
    for path in no:
        assert not re.fullmatch(ere, path) and not fsprofile._matches(pattern, path), path


def test_a_glob_deny_never_denies_its_directory() -> None:
    text = _shape("glob-deny")
    assert _decide(text, "file-read*", "/srv/app/prod.env") is False
    assert _decide(text, "file-read*", "/srv/app") is True
    assert _decide(text, "file-read*", "/srv/app/main.py") is True
    assert '(subpath "/srv' not in text


rule = st.builds(
    lambda neg, segs: ("!" if neg else "") + "/" + "/".join(segs),
    st.booleans(),
    st.lists(
        st.one_of(st.sampled_from(["a", "b", "e.env", "**", "*", "?"])), min_size=1, max_size=3
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(rule, min_size=1, max_size=6))
def test_compiled_reads_decide_as_check_path(rules: list[str]) -> None:
    """Last match wins in both: the SBPL read decision equals fsprofile.check_path."""
    profile = fsprofile.EffectiveProfile(name="p", read=tuple(rules), modify=())
    text = compile_sbpl(SbplInput(profile=profile, base="/w", executable=EXE))
    section = text[text.index(";; read rules") : text.index(";; network")]
    for parts in [[], ["a"], ["b"], ["a", "b"], ["a", "e.env"], ["b", "a", "x"], ["e.env"]]:
        path = "/" + "/".join(parts)
        assert _decide(section, "file-read*", path) == fsprofile.check_path(rules, path, base="/w")


def test_writes_stay_inside_the_write_root_and_modify_rules() -> None:
    text = _shape("scoped-write")
    assert _decide(text, "file-write*", "/srv/project/build/out.o")
    assert not _decide(text, "file-write*", "/srv/project/build/keep/x")
    assert not _decide(text, "file-write*", "/srv/project/build/x.lock")
    assert not _decide(text, "file-write*", "/srv/project/src/main.c")  # no modify rule
    assert not _decide(text, "file-write*", "/usr/bin/x")


def test_read_denies_also_deny_writes_and_links_under_private() -> None:
    text = _shape("global-denies-accumulate")
    out = SCRATCH + "/out"
    assert _decide(text, "file-write*", out + "/a.txt")
    assert not _decide(text, "file-write*", out + "/.env")  # read-denied: not written either
    assert not _decide(text, "file-read*", "/private/etc/shadow")  # macOS's real path
    assert not _decide(text, "file-read*", "/etc/shadow")
    assert not _decide(text, "file-read*", "/home/u/.ssh/id_ed25519")
    assert _decide(text, "file-read*", "/home/u/notes")


def test_a_wildcard_first_segment_gets_only_the_private_links_it_names() -> None:
    profile = fsprofile.EffectiveProfile(name="p", read=("/**", "!/?tc/passwd"), modify=())
    text = compile_sbpl(SbplInput(profile=profile, base="/w", executable=EXE))
    assert not _decide(text, "file-read*", "/private/etc/passwd")
    assert _decide(text, "file-read*", "/private/xtc/passwd")


# --- escaping and refusals ------------------------------------------------------------


@pytest.mark.parametrize("path", ['/a "quoted"/b', "/back\\slash", '/both\\"', "/semi;colon (x)"])
def test_literal_paths_round_trip_exactly(path: str) -> None:
    (form,) = _parse(f"(literal {sbpl.quote(path)})")
    assert form == ["literal", ("str", path)]


@pytest.mark.parametrize(
    "rule",
    ['/a/"x"/*.env', "/a\\b/*", "/a/^x*", "/caf\u00e9/**", "/tab\there", "/nl\n/**", "/del\x7f"],
)
def test_what_sbpl_cannot_write_exactly_is_refused(rule: str) -> None:
    profile = fsprofile.EffectiveProfile(name="p", read=("/**", "!" + rule), modify=())
    with pytest.raises(SbplError) as info:
        compile_sbpl(SbplInput(profile=profile, base="/w", executable=EXE))
    assert info.value.code == "sbpl-unexpressible"


def test_a_refused_rule_refuses_the_action_in_the_ledger() -> None:
    decl, _ = _factory()[0]
    policy = fsprofile.load_policy({"schemaVersion": 2, "denyRead": ["/caf\u00e9/**"]})
    state, gaps = darwin.platform_state(decl, policy, "darwin") or ("", [])
    assert state == "unsupported_by_runtime" and "sbpl-unexpressible" in gaps[0]


# --- the platform switch and the wrapping ---------------------------------------------


def test_the_platform_switch_is_explicit() -> None:
    decl, _ = _factory()[0]
    policy = fsprofile.load_policy(None)
    assert darwin.backend("linux") == "linux" and darwin.backend("darwin") == "darwin"
    assert darwin.platform_state(decl, policy, "linux") is None
    state, (why,) = darwin.platform_state(decl, policy, "win32") or ("", [""])
    assert state == "unsupported_by_runtime" and "'win32' has no sandbox backend" in why
    for cls in ("scoped-fs-write", "egress-network-spawn", "artifact-producing-spawn"):
        other = msgspec.structs.replace(decl, class_=cls)
        state, (why,) = darwin.platform_state(other, policy, "darwin") or ("", [""])
        assert state == "unsupported_by_runtime" and why.startswith("macOS: class"), cls
    pinned = msgspec.structs.replace(
        decl, executable=msgspec.structs.replace(decl.executable, sha256="0" * 64)
    )
    assert darwin.platform_state(pinned, policy, "darwin") == (
        "unsupported_by_runtime",
        ["macOS: a pinned program would be exec'd by path after its check (no fexecve)"],
    )


def test_wrap_is_pure_and_ends_sandbox_exec_options() -> None:
    w = darwin.wrap(["-evil", "x"], "/bin/echo", "(version 1)\n", "/run/r1")
    assert w.executable == "/usr/bin/sandbox-exec"
    assert w.argv == ["sandbox-exec", "-f", "/run/r1/profile.sb", "--", "/bin/echo", "x"]
    assert w.files == {"/run/r1/profile.sb": "(version 1)\n"}
    with pytest.raises(SbplError):
        darwin.wrap([], "/bin/echo", "", "/run/r1")


def test_prepare_writes_the_profile_read_only_and_cleans_up(tmp_path: Path) -> None:
    decl, raw = _factory()[0]
    specs: list[tuple[list[str], str, str]] = []

    def make_spec(d: Declaration, argv: list[str], cwd: str, t: float, exe: str) -> Any:
        specs.append((argv, cwd, exe))
        return (argv, cwd, exe)

    run = tmp_path / "run"
    prepared = darwin.prepare(
        decl, {"path": "/srv"}, fsprofile.load_policy(raw), run, make_spec, 1.0
    )
    try:
        ((argv, cwd, exe),) = specs
        profile = run / "profile.sb"
        assert exe == "/usr/bin/sandbox-exec" and argv[:4] == [
            "sandbox-exec",
            "-f",
            str(profile),
            "--",
        ]
        assert argv[4:] == ["/usr/bin/ls", "-la", "--", "/srv"] and prepared.argv[0] == "ls"
        assert stat.S_IMODE(profile.stat().st_mode) == 0o400
        assert f'(subpath "{cwd}")' in profile.read_text()
    finally:
        prepared.cleanup()
    assert not run.exists() and not os.path.exists(cwd)


def test_doctests() -> None:
    for module in (sbpl, darwin):
        assert doctest.testmod(module).failed == 0
