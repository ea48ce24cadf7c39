"""The guides in docs/ are run, not just read: every Python block and every shell block
(unless marked ``<!-- not run: REASON -->`` just before it) runs against a live node in
a temporary state directory, and every relative link points at a file and heading that
exist. A ``console`` block (README.md and docs/) is a transcript: each ``$ command`` runs,
and the output printed under it must be what the command prints, ids, times, numbers
and paths aside (``…`` stands for any text, or alone on a line for any lines)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harness import Stack

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]
# A fence at the start of a line (blocks indented inside a list are illustrations).
BLOCK = re.compile(r"(<!-- not run: [^>]+ -->\n)?^```(sh|python|console)\n(.*?)^```", re.S | re.M)
# What differs between runs and machines, masked in samples and output alike.
VOLATILE = [
    (r"(public:\s+)\S{40}$", r"\1<key>"),  # a CURVE public key (Z85)
    (r"\d{4}-\d\d-\d\dT[\d:.]+Z?", "<time>"),
    (r"\b(?:[0-9A-HJKMNP-TV-Z]{26}|[0-9A-HJKMNP-TV-Z]{4,25}…)", "<id>"),
    (r"\b\d+(?:d\d+h|h\d+m|m\d+s|s) ago\b|\bnow\b", "<when>"),  # "3s ago" is "now" soon
    (r"\b\d+(?:d\d+h|h\d+m|m\d+s|s)\b", "<dur>"),
    (r"(?<![\w.])[~/][\w.@%+=:,/…-]*", "<path>"),
    (r"\b[0-9a-f]{12,64}\b", "<hex>"),  # key ids, hashes
    (r"\d+(?:\.\d+)?", "<n>"),
]


def _blocks(page: Path, lang: str) -> list[str]:
    return [
        code for skip, kind, code in BLOCK.findall(page.read_text()) if kind == lang and not skip
    ]


def _env(stack: Stack) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "SENSORIUM_STATE_DIR": str(stack.paths.root),
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_block_of_a_guide_runs_against_a_live_node(stack: Stack, page: Path) -> None:
    env = _env(stack)
    for code in _blocks(page, "python"):
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True,
            timeout=120, cwd="/", check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"{page.name}:\n{code}\n---\n{res.stderr}"
    for code in _blocks(page, "sh"):
        res = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code], env=env, capture_output=True,
            text=True, timeout=180, cwd="/", check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"{page.name}:\n{code}\n---\n{res.stdout}\n{res.stderr}"


def _normal(line: str) -> str:
    for pattern, mask in VOLATILE:
        line = re.sub(pattern, mask, line)
    return " ".join(line.split())  # table columns widen and narrow


def _printed_as_shown(sample: list[str], printed: list[str]) -> bool:
    """Line for line, after masking; ``…`` is any text, alone on a line any lines."""
    if not sample:
        return not printed
    head, rest = sample[0], sample[1:]
    if head == "…":
        return any(_printed_as_shown(rest, printed[i:]) for i in range(len(printed) + 1))
    pattern = ".*".join(re.escape(part) for part in head.split("…"))
    return bool(printed and re.fullmatch(pattern, printed[0])) and _printed_as_shown(
        rest, printed[1:]
    )


def _transcript(block: str) -> list[tuple[str, list[str]]]:
    """A console block's ``$ command`` lines, each with the output shown under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(_normal(line))
    return steps


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_console_sample_prints_what_it_shows(stack: Stack, page: Path) -> None:
    env = _env(stack)
    # As a reader meets it: settled, the poller having seen core (it probes each second).
    for _ in range(60):
        status = subprocess.run(
            ["sensorium", "status"], env=env, capture_output=True, text=True, check=False
        )
        if "reachable;" in status.stdout:
            break
        time.sleep(0.25)
    with tempfile.TemporaryDirectory() as cwd:
        env["HOME"] = cwd  # what a sample writes under ~ stays in the test
        for block in _blocks(page, "console"):
            for command, shown in _transcript(block):
                res = subprocess.run(
                    ["bash", "-o", "pipefail", "-c", command], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True, timeout=180, cwd=cwd, check=False,
                )  # fmt: skip
                printed = [_normal(line) for line in res.stdout.splitlines() if line.strip()]
                where = f"{page.name}: $ {command}\n--- printed:\n{res.stdout}"
                if not shown:  # nothing shown: it must at least succeed
                    assert res.returncode == 0, where
                else:
                    assert _printed_as_shown(shown, printed), (
                        where + "--- shown (masked):\n" + "\n".join(shown)
                    )


def test_the_state_directory_tree_names_everything_a_node_makes(stack: Stack) -> None:
    """operating.md's tree of the state directory, against a live one after an invoke."""
    env = _env(stack)
    subprocess.run(
        ["sensorium", "invoke", "demo.fs.stat", "--param", "path=/etc/hostname"],
        env=env, capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    text = (REPO / "docs/operating.md").read_text()
    tree = text.split("## The state directory", 1)[1].split("```")[1]
    names = [line.split()[0] for line in tree.splitlines()[2:] if line.startswith("  ")]
    # <process>, NAME and * stand for one path component; a trailing / for a whole tree.
    shapes = [
        re.sub(r"<[^>]+>|NAME|\\\*", "[^/]+", re.escape(n)) + (".*" if n.endswith("/") else "")
        for n in names
        if not n.startswith("(")
    ]
    made = [
        str(p.relative_to(stack.paths.root)) + ("/" if p.is_dir() else "")
        for p in stack.paths.root.rglob("*")
        if not p.name.endswith(("-wal", "-shm"))  # SQLite's own companions
    ]
    unnamed = [
        m
        for m in made
        if not any(re.fullmatch(s, m) for s in shapes)
        and not any(n.startswith(m) for n in names)  # a folder the tree goes into
    ]
    assert not unnamed, f"in the state dir, not in operating.md's tree: {unnamed}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
                continue
            if anchor and file.suffix == ".md":
                heads = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
                if anchor not in {_anchor(h) for h in heads}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_action_a_help_text_or_guide_names_is_in_the_factory_catalog() -> None:
    import json

    factory = json.loads((REPO / "connectors/os/factory/sensorium-os.json").read_text())
    known = {a["action_id"] for a in factory["action_catalog"]}
    groups = {a["group"] for a in factory["action_catalog"]}
    texts = [
        *(p.read_text() for p in PAGES),
        *(p.read_text() for p in (REPO / "client/cli").glob("*.py")),
    ]
    named = {m for t in texts for m in re.findall(r"\bdemo\.[a-z][a-z0-9.-]*[a-z0-9]", t)}
    # A prefix (of a `demo.fs.*` pattern) is fine when actions start with it.
    unknown = sorted(
        n
        for n in named
        if n not in known | groups
        and n != "demo.nope"  # the docs' example of an unknown action
        and not any(k.startswith(n + ".") for k in known)
    )
    assert not unknown, f"not in the factory catalog: {unknown}"


def test_the_site_builds_with_sphinx_and_no_warning(tmp_path: Path) -> None:
    """The command the README gives, into a temporary folder: -W fails on any warning,
    so a broken link, anchor or reference, or Markdown the parser cannot map, fails."""
    res = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-W", "--keep-going", "-c", "docs", ".",
         str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "docs" / "troubleshooting.html").exists()
    readme = (REPO / "README.md").read_text()
    assert "python -m sphinx -W --keep-going -c docs . build/docs" in readme
