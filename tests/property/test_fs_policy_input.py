"""fs policies built to break the loader and the matcher: any JSON in place of a policy,
rules with many wildcards, too many rules, and paths an action chose.

Invariant: ``load_policy`` returns a policy or raises PolicyError (catalog-invalid); on a
loaded policy, resolving profiles, checking paths and planning reads never raise or hang.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import fuzz_examples as ex
import fuzz_strategies as hs
import pytest
from fuzz_targets import ACCEPTED, PROPERTY, bounded, fs_policy, paths_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.shared.wire.fs_policy import PROFILES_MAX, RULES_MAX, WILDCARD_SEGMENTS_MAX


@PROPERTY
@given(st.one_of(hs.mutated(ex.POLICY), hs.jsonish), paths_strategy)
def test_any_policy_loads_or_is_refused_and_a_loaded_one_is_usable(
    raw: Any, paths: list[str]
) -> None:
    with bounded():
        assert fs_policy(raw, paths) in {ACCEPTED, "catalog-invalid"}


# --- the matcher -----------------------------------------------------------------------


def _reference(pattern: str, path: str) -> bool:
    """Segment globs by plain recursion: exponential, so only for tiny inputs."""
    segs = [s for s in pattern.split("/")[1:] if pattern != "/"]
    parts = path.split("/")[1:] if path != "/" else []

    def glob(p: str, t: str) -> bool:
        if not p:
            return not t
        if p[0] == "*":
            return any(glob(p[1:], t[i:]) for i in range(len(t) + 1))
        return bool(t) and p[0] in ("?", t[0]) and glob(p[1:], t[1:])

    @functools.cache
    def walk(i: int, j: int) -> bool:
        if i == len(segs):
            return j == len(parts)
        if segs[i] == "**":
            return any(walk(i + 1, k) for k in range(j, len(parts) + 1))
        return j < len(parts) and glob(segs[i], parts[j]) and walk(i + 1, j + 1)

    return walk(0, 0)


segment = st.text(st.sampled_from("ab*?."), min_size=1, max_size=6) | st.just("**")
part = st.text(st.sampled_from("ab.*?"), min_size=1, max_size=7).filter(
    lambda s: s not in (".", "..")
)


@settings(PROPERTY, max_examples=300)
@given(st.lists(segment, max_size=5), st.lists(part, max_size=5))
def test_the_matcher_agrees_with_plain_recursive_globbing(
    segs: list[str], parts: list[str]
) -> None:
    pattern, path = "/" + "/".join(segs), "/" + "/".join(parts)
    assert fsprofile._matches(pattern, path) == _reference(pattern, path)


@pytest.mark.parametrize(
    ("rule", "name"),
    [
        ("/out/" + "*a" * 8 + "*b", "a" * 255),  # took minutes with the regex matcher
        ("/out/*" + "a" * 4000 + "b", "a" * 255),
        ("/out/*" + "?" * 200 + "b*", "a" * 255),
    ],
)
def test_an_action_chosen_name_cannot_stall_the_matcher(rule: str, name: str) -> None:
    policy = fsprofile.load_policy(
        {"schemaVersion": 2, "fsProfiles": {"p": {"read": ["/out/**"], "modify": [rule]}}}
    )
    profile = fsprofile.effective_profile(policy, "p")
    t0 = time.monotonic()
    for _ in range(50):
        fsprofile.check_path(profile.modify, f"/out/{name}", base="/srv/work")
    assert time.monotonic() - t0 < 1


def test_deep_wildcard_rules_against_deep_paths_stay_fast() -> None:
    pattern = "/**/*a" * WILDCARD_SEGMENTS_MAX
    t0 = time.monotonic()
    assert not fsprofile._matches(pattern + "/b", "/a" * 2000)
    assert time.monotonic() - t0 < 1


def _problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(fsprofile.PolicyError) as info:
        fsprofile.load_policy(raw)
    return info.value.problems


def test_caps_on_rules_profiles_and_wildcards() -> None:
    many = [f"/r{i}/**" for i in range(RULES_MAX + 1)]
    [(where, why)] = _problems({"schemaVersion": 2, "denyRead": many})
    assert where == "$.denyRead" and f"at most {RULES_MAX}" in why
    # A profile over the cap is refused before its read x modify coverage check.
    body = {"read": many, "modify": many}
    t0 = time.monotonic()
    problems = _problems({"schemaVersion": 2, "fsProfiles": {"p": body}})
    assert len(problems) == 2 and time.monotonic() - t0 < 1
    profiles = {f"p{i}": {} for i in range(PROFILES_MAX + 1)}
    [(where, why)] = _problems({"schemaVersion": 2, "fsProfiles": profiles})
    assert where == "$.fsProfiles" and f"at most {PROFILES_MAX}" in why
    wild = "/" + "/".join(["*"] * (WILDCARD_SEGMENTS_MAX + 1))
    [(where, why)] = _problems({"schemaVersion": 2, "denyRead": [wild]})
    assert where == "$.denyRead[0]" and "wildcards" in why
    fsprofile.load_policy(
        {"schemaVersion": 2, "denyRead": ["/" + "/".join(["*"] * WILDCARD_SEGMENTS_MAX)]}
    )
