"""``sensorium-fs-policy.v2``: named filesystem profiles plus global denies (policy ADR-002).

The document is part of the OS connector's configuration, so it is signed with it::

    {"schemaVersion": 2,
     "fsProfiles": {"tools": {"read": ["/usr/**", "!/usr/local/**"], "modify": []}},
     "denyRead": ["/root/**", "**/*.env"],
     "denyModify": ["/etc/**"]}

A rule is a path pattern: absolute (``/usr/**``), relative to the action's working area
(``./build/**``) or anchored anywhere (``**/*.env``); a leading ``!`` negates it. The
schema checks the shape only; ``connectors/os/sandbox/fsprofile.load_policy`` checks the
rest (``..`` segments, modify rules covered by read rules, the caps below) and reports
every problem.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from sensorium.shared.wire.base import Message

RULE_MAX = 4096
# Caps the loader enforces so that checking a policy, and matching paths against it, stays
# fast whatever the file says: coverage checks are read x modify rules, and each wildcard
# segment of a rule is tried against every reachable segment of a path.
RULES_MAX = 1024  # per list: a profile's read or modify, denyRead, denyModify
PROFILES_MAX = 256
WILDCARD_SEGMENTS_MAX = 16  # segments of one rule holding '*', '**' or '?'
Rule = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=RULE_MAX,
        pattern=r"^!?(\.?/|\*\*(/|$))[^\x00]*\Z",
        description="'/abs/**', './relative/**' or '**/anywhere'; a leading '!' negates",
    ),
]
PROFILE_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*\Z"
PROFILE_NAME_MAX = 64
ProfileName = Annotated[
    str, msgspec.Meta(pattern=PROFILE_NAME_PATTERN, max_length=PROFILE_NAME_MAX)
]


class FsProfileRules(Message, frozen=True, kw_only=True):
    """One named profile: what a process may read and what it may modify, in rule order."""

    read: list[Rule] = msgspec.field(default_factory=list)
    modify: list[Rule] = msgspec.field(default_factory=list)


class FsPolicy(Message, frozen=True, kw_only=True):
    """The whole policy; global denies are appended to every profile as ``!<rule>``."""

    schemaVersion: Literal[2]  # noqa: N815 - field names from the policy seed
    fsProfiles: dict[ProfileName, FsProfileRules] = msgspec.field(default_factory=dict)  # noqa: N815
    denyRead: list[Rule] = msgspec.field(default_factory=list)  # noqa: N815
    denyModify: list[Rule] = msgspec.field(default_factory=list)  # noqa: N815
