"""Filesystem policy v2: loading, profile resolution, last-match-wins checks, kernel plans."""

from __future__ import annotations

import doctest
import importlib.resources
import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.connectors.os.run.sandbox.fsprofile import (
    EffectiveProfile,
    PolicyError,
    ReadPlan,
    check_path,
    compile_read,
    effective_profile,
    load_policy,
)
from sensorium.shared.wire.fs_policy import FsPolicy, FsProfileRules

BASE = "/srv/work"
EXAMPLE: dict[str, Any] = {
    "schemaVersion": 2,
    "fsProfiles": {"tools": {"read": ["/usr/**", "/etc/**", "!/etc/secret/**"], "modify": []}},
    "denyRead": ["/root/**", "**/*.env"],
    "denyModify": ["/etc/**"],
}
ENV_GAP = (
    "deny rule '**/*.env' matches by pattern inside granted tree '/': not enforceable by "
    "Landlock or masking; files it names stay readable"
)


def _problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as info:
        load_policy(raw)
    return info.value.problems


def _plan(*read: str, base: str = BASE) -> ReadPlan:
    return compile_read(EffectiveProfile(name="t", read=read, modify=()), base=base)


# --- loading ---------------------------------------------------------------------------


def test_example_loads() -> None:
    policy = load_policy(EXAMPLE)
    assert policy.fsProfiles["tools"].read == ["/usr/**", "/etc/**", "!/etc/secret/**"]
    assert policy.denyRead == ["/root/**", "**/*.env"]
    assert load_policy(None) == FsPolicy(schemaVersion=2)
    assert load_policy({"schemaVersion": 2}) == FsPolicy(schemaVersion=2)


def test_v1_is_rejected_with_a_migration_message() -> None:
    problems = _problems({"schemaVersion": 1, "allow": ["/usr/**"]})
    assert len(problems) == 1  # the v1 shape is not picked apart field by field
    where, message = problems[0]
    assert where == "$.schemaVersion"
    assert "schemaVersion 1 is no longer accepted" in message
    for word in ('"denyRead"', '"denyModify"', '"fsProfiles"', '"read"', '"modify"'):
        assert word in message


@pytest.mark.parametrize(
    ("version", "said"),
    [(None, "missing"), (3, "3 is not supported"), (True, "True is not supported")],
)
def test_other_versions_are_rejected(version: object, said: str) -> None:
    raw: dict[str, Any] = {} if version is None else {"schemaVersion": version}
    [(where, message)] = _problems(raw)
    assert where == "$.schemaVersion" and said in message and "rewrite it as" in message


def test_all_problems_at_once() -> None:
    raw = {
        "schemaVersion": 2,
        "denyRead": ["", "usr/**", "/a/../b", "/a\x00b", "!/x"],
        "denyModify": "/etc/**",
        "fsProfiles": {
            "tools": {"read": ["/a//b", "!", "/ok/**", 7], "modify": ["/elsewhere/x"], "x": 1},
            "9bad": {},
            "notobj": [],
        },
        "extra": True,
    }
    problems = _problems(raw)
    paths = [where for where, _ in problems]
    assert paths == [
        "$.extra",
        "$.denyRead[0]",
        "$.denyRead[1]",
        "$.denyRead[2]",
        "$.denyRead[3]",
        "$.denyRead[4]",
        "$.denyModify",
        "$.fsProfiles.tools.x",
        "$.fsProfiles.tools.read[0]",
        "$.fsProfiles.tools.read[1]",
        "$.fsProfiles.tools.read[3]",
        "$.fsProfiles.tools.modify[0]",
        "$.fsProfiles.9bad",
        "$.fsProfiles.notobj",
    ]
    text = dict(problems)
    assert "names no path" in text["$.denyRead[0]"]
    assert "must be absolute" in text["$.denyRead[1]"] and "'./…'" in text["$.denyRead[1]"]
    assert "'..' segment" in text["$.denyRead[2]"]
    assert "NUL" in text["$.denyRead[3]"]
    assert "drop the leading '!'" in text["$.denyRead[4]"]
    assert "empty or '.' segment" in text["$.fsProfiles.tools.read[0]"]
    assert "14 problem(s)" in str(PolicyError(problems))


def test_modify_must_be_covered_by_read() -> None:
    raw = {
        "schemaVersion": 2,
        "fsProfiles": {
            "build": {"read": ["/src/**"], "modify": ["./build/**", "/srcx/a", "!/nope/**"]},
            "ok": {
                "read": ["/a/**", "./b/**", "/c/file", "!/a/**"],
                "modify": ["/a", "/a/deep/**", "./b/**", "/c/file", "./b/x/*.o"],
            },
            "all": {"read": ["**"], "modify": ["/anything/**"]},
            "root": {"read": ["/**"], "modify": ["./anything"]},
        },
    }
    problems = _problems(raw)
    assert [where for where, _ in problems] == [
        "$.fsProfiles.build.modify[0]",
        "$.fsProfiles.build.modify[1]",  # '/src/**' covers '/src/...', not '/srcx'
    ]
    assert "not covered by a read rule of profile 'build'" in problems[0][1]
    assert "add './build/**'" in problems[0][1]


def test_schema_file_round_trips() -> None:
    schema_file = importlib.resources.files("sensorium.schemas") / (
        "sensorium-fs-policy.v2.schema.json"
    )
    validator = jsonschema.Draft202012Validator(json.loads(schema_file.read_text("utf-8")))
    encoded = json.loads(msgspec.json.encode(load_policy(EXAMPLE)))
    validator.validate(encoded)
    assert msgspec.convert(encoded, FsPolicy) == load_policy(EXAMPLE)
    assert not validator.is_valid({"schemaVersion": 1})
    assert not validator.is_valid({"schemaVersion": 2, "denyRead": ["usr/**"]})
    assert not validator.is_valid({"schemaVersion": 2, "fsProfiles": {"t": {"write": []}}})


# --- resolution ------------------------------------------------------------------------


def test_unrestricted_is_synthesized_and_narrowed_by_global_denies() -> None:
    profile = effective_profile(load_policy(EXAMPLE), None)
    assert profile == EffectiveProfile(
        name="unrestricted",
        read=("/**", "!/root/**", "!**/*.env"),
        modify=("./**", "!/etc/**"),
    )
    assert "read=('/**', '!/root/**', '!**/*.env')" in repr(profile)
    assert check_path(profile.read, "/usr/lib/libc.so.6", base=BASE)
    assert not check_path(profile.read, "/root/.bashrc", base=BASE)
    assert not check_path(profile.read, "/srv/work/.env", base=BASE)
    assert check_path(profile.modify, "/srv/work/out.txt", base=BASE)
    assert not check_path(profile.modify, "/usr/bin/ls", base=BASE)


def test_a_defined_unrestricted_profile_shadows_the_synthesized_one() -> None:
    raw = {
        "schemaVersion": 2,
        "fsProfiles": {"unrestricted": {"read": ["./**"]}},
        "denyRead": ["./.git/**"],
    }
    profile = effective_profile(load_policy(raw), None)
    assert profile.read == ("./**", "!./.git/**") and profile.modify == ()
    assert not check_path(profile.read, "/usr/bin/ls", base=BASE)
    assert check_path(profile.read, "/srv/work/a.txt", base=BASE)
    assert not check_path(profile.read, "/srv/work/.git/config", base=BASE)


def test_unknown_profile_names_the_defined_ones() -> None:
    with pytest.raises(PolicyError) as info:
        effective_profile(load_policy(EXAMPLE), "compilers")
    [(where, message)] = info.value.problems
    assert where == "$.fsProfiles.compilers"
    assert "defined: tools" in message and "'unrestricted'" in message


def test_last_match_wins_within_a_profile_and_global_denies_come_last() -> None:
    raw = {
        "schemaVersion": 2,
        "fsProfiles": {"p": {"read": ["/data/**", "!/data/private/**", "/data/private/ok"]}},
        "denyRead": ["/data/private/ok"],
    }
    policy = load_policy(raw)
    profile_rules = policy.fsProfiles["p"].read
    assert check_path(profile_rules, "/data/a", base=BASE)
    assert not check_path(profile_rules, "/data/private/b", base=BASE)
    assert check_path(profile_rules, "/data/private/ok", base=BASE)  # re-allowed later
    profile = effective_profile(policy, "p")
    assert not check_path(profile.read, "/data/private/ok", base=BASE)  # global deny is last
    assert not check_path(profile.read, "/elsewhere", base=BASE)  # default deny
    assert not check_path((), "/", base=BASE)


def test_glob_semantics() -> None:
    def ok(rule: str, path: str) -> bool:
        return check_path([rule], path, base=BASE)

    assert ok("/usr/**", "/usr") and ok("/usr/**", "/usr/lib/x/y")  # '**' = zero or more
    assert ok("/a/**/b", "/a/b") and ok("/a/**/b", "/a/x/y/b") and not ok("/a/**/b", "/a/xb")
    assert ok("/**", "/") and ok("/**", "/etc")
    assert ok("/home/*/notes", "/home/ann/notes") and not ok("/home/*/notes", "/home/a/b/notes")
    assert ok("/etc/*.conf", "/etc/.x.conf") and not ok("/etc/*.conf", "/etc/sub/x.conf")
    assert ok("/tmp/?", "/tmp/a") and not ok("/tmp/?", "/tmp/ab") and not ok("/?", "/")
    assert ok("/x/[ab]", "/x/[ab]") and not ok("/x/[ab]", "/x/a")  # nothing else is special
    assert ok("**/*.env", "/a/b/.env") and ok("**/*.env", "/x.env")
    assert ok("/a/**/**/b", "/a/b") and ok("/a/***", "/a/bc")
    assert ok("/etc/passwd", "/etc/passwd") and not ok("/etc/passwd", "/etc/passwd/x")


def test_relative_rules_resolve_against_base() -> None:
    assert check_path(["./build/**"], "/srv/work/build/a.o", base=BASE)
    assert not check_path(["./build/**"], "/build/a.o", base=BASE)
    assert check_path(["./**"], "/srv/work", base=BASE)
    assert check_path(["./x"], "/x", base="/")
    for bad in ("relative", "/a/../b", "/a/"):
        with pytest.raises(ValueError, match="absolute, normalized"):
            check_path(["/**"], bad, base=BASE)
        with pytest.raises(ValueError, match="absolute, normalized"):
            check_path(["/**"], "/a", base=bad)


# --- kernel plans ----------------------------------------------------------------------


def test_example_tools_plan() -> None:
    plan = compile_read(effective_profile(load_policy(EXAMPLE), "tools"), base=BASE)
    assert plan.grants == ("/etc", "/usr")
    assert plan.masks == ("/etc/secret",)  # /root lies outside every grant: nothing to do
    assert plan.gaps == (
        ENV_GAP.replace("'/'", "'/usr'"),
        ENV_GAP.replace("'/'", "'/etc'"),
    )


def test_unrestricted_plan_and_describe() -> None:
    plan = compile_read(effective_profile(load_policy(EXAMPLE), None), base=BASE)
    assert plan == ReadPlan(grants=("/",), masks=("/root",), gaps=(ENV_GAP,))
    assert plan.describe() == f"read plan:\n  grant /\n  mask  /root\n  gap   {ENV_GAP}"


def test_grants_are_deduped_unnested_sorted_and_relative() -> None:
    plan = _plan("/var/**", "/etc/passwd", "/usr/**", "/usr/lib/**", "/var/**", "./**", "/usr/x")
    assert plan == ReadPlan(grants=("/etc/passwd", "/srv/work", "/usr", "/var"), masks=(), gaps=())
    assert _plan("./**", "!./.git/**").masks == ("/srv/work/.git",)


def test_positive_wildcard_cannot_be_granted() -> None:
    plan = _plan("/home/*/notes", "/usr/**", "/usr/*/bin")
    assert plan.grants == ("/usr",)  # '/usr/*/bin' lies inside a granted tree already
    assert plan.gaps == (
        "read rule '/home/*/notes' has wildcards Landlock cannot grant (only a literal path "
        "or a whole tree): paths it names stay unreadable",
    )
    assert _plan("/home/*/notes", "/home/**").gaps == ()  # a later tree re-allows it all


def test_negative_rules_outside_grants_need_nothing() -> None:
    assert _plan("/usr/**", "!/root/**", "!/home/*/x", "!/etc/shadow") == ReadPlan(
        grants=("/usr",), masks=(), gaps=()
    )


def test_negative_rules_revoke_what_they_cover_exactly() -> None:
    assert _plan("/usr/**", "/etc/**", "!/etc/**").grants == ("/usr",)
    assert _plan("/etc/passwd", "!/etc/passwd").grants == ()
    assert _plan("/a/.env", "/usr/**", "!**/*.env") == ReadPlan(
        grants=("/usr",),
        masks=(),
        gaps=(ENV_GAP.replace("'/'", "'/usr'"),),
    )
    assert _plan("/home/ann/docs/**", "!/home/*/**").grants == ()


def test_reallow_inside_a_mask_is_a_gap_and_a_whole_reallow_lifts_it() -> None:
    plan = _plan("/**", "!/etc/**", "/etc/ssl/**")
    assert plan.grants == ("/",) and plan.masks == ("/etc",)
    assert plan.gaps == (
        "read rule '/etc/ssl/**' re-allows paths inside masked '/etc': the mask wins "
        "(stricter than policy)",
    )
    assert _plan("/**", "!/etc/**", "/etc/ssl/**", "/**") == ReadPlan(
        grants=("/",), masks=(), gaps=()
    )
    assert _plan("/**", "!/etc/**", "/etc/**").masks == ()
    assert _plan("/**", "!/etc/**", "/e*/x").gaps[0].startswith("read rule '/e*/x' re-allows")


def test_masks_drop_nested_and_follow_their_grant() -> None:
    assert _plan("/**", "!/etc/ssl/**", "!/etc/**", "!/etc/x").masks == ("/etc",)
    assert _plan("/usr/**", "!/usr/share/**", "!/usr/**").masks == ()


def test_negative_wildcard_gap_lapses_when_re_allowed_or_revoked() -> None:
    assert _plan("/usr/**", "!/usr/**/*.env", "/usr/**").gaps == ()
    assert _plan("/usr/**", "!**/*.env", "!/usr/**") == ReadPlan(grants=(), masks=(), gaps=())
    assert _plan("!**/*.env", "/**").gaps == ()  # the later grant re-allows them


def test_literal_directories_are_reported(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    d, f = str(tmp_path / "d"), str(tmp_path / "f")
    plan = _plan(d, f)
    assert plan.grants == (d, f)
    assert plan.gaps == (
        f"read rule {d!r} names a directory: Landlock grants its whole tree, more than "
        "the rule allows",
    )
    plan = _plan(f"{tmp_path}/**", f"!{d}", f"!{f}")
    assert plan.masks == (d, f)
    assert plan.gaps == (
        f"deny rule {d!r} names a directory: masking hides its contents too (stricter than "
        "the policy)",
    )


def test_module_examples_run() -> None:
    result = doctest.testmod(fsprofile)
    assert result.attempted > 0 and result.failed == 0


def test_profile_rules_defaults() -> None:
    assert FsProfileRules() == FsProfileRules(read=[], modify=[])
