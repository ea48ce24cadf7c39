"""Argv templates and parameters built to break the renderer."""

from __future__ import annotations

from typing import Any

import fuzz_strategies as hs
from fuzz_targets import ArgvCase
from hypothesis import strategies as st

NAMES = ["path", "lines", "value", "params_json", "scratch", "write_root", "unknown"]
CONNECTOR = {"scratch": "/run/scratch", "write_root": "/srv/out"}
long_text = st.integers(0, 300_000).map(lambda n: "x" * n)
values = st.one_of(hs.jsonish, hs.ODD_TEXT, long_text, st.sampled_from(hs.HUGE_NUMBERS))
piece = st.one_of(
    st.sampled_from(NAMES).map(lambda n: "{{" + n + "}}"),
    st.text(max_size=12),
    st.sampled_from(["--", "-", "{{", "}}", "{{ path }}", "{{9x}}", "\x00", "{{{path}}}"]),
)
element = st.lists(piece, min_size=0, max_size=4).map("".join)


@st.composite
def argv_cases(draw: st.DrawFn) -> ArgvCase:
    shape = ["prog", *draw(st.lists(element, max_size=8))]
    # One placeholder repeated many times: a small parameter made huge by the template.
    if draw(st.booleans()):
        shape.append("{{value}}" * draw(st.integers(1, 400)))
    params: dict[str, Any] = draw(
        st.dictionaries(st.sampled_from([*NAMES[:3], "extra"]), values, max_size=4)
    )
    if draw(st.booleans()):
        params["value"] = draw(long_text)
    connector = draw(st.sampled_from([{}, CONNECTOR]))
    return ArgvCase(shape=shape, params=params, connector_values=connector)
