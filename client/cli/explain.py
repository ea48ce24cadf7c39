"""Explain a diagnostic code: what it means, its usual causes, and what to do.

sensorium explain CODE          one code
sensorium explain --list        every code, with what a caller should do
sensorium explain --markdown    the troubleshooting page (docs/troubleshooting.md)
"""

from __future__ import annotations

import argparse
import sys

from sensorium.shared.explanations import EXPLANATIONS, explain, troubleshooting_markdown


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("code", nargs="?", help="a diagnostic code, e.g. grant-denied")
    p.add_argument("--list", action="store_true", help="every code, one a line")
    p.add_argument("--markdown", action="store_true", help="the troubleshooting page")


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(troubleshooting_markdown())
        return 0
    if args.list or not args.code:
        for code in sorted(EXPLANATIONS):
            print(f"{code:28} {EXPLANATIONS[code].remedy}")
        return 0
    found = explain(args.code)
    if found is None:
        print(
            f"sensorium: no such diagnostic code: {args.code!r}; "
            "`sensorium explain --list` shows them all",
            file=sys.stderr,
        )
        return 2
    print(f"{args.code}: {found.meaning}\n")
    print("Usual causes:")
    for cause in found.causes:
        print(f"  - {cause}")
    print(f"\nWhat to do ({found.remedy}): {found.action}")
    return 0
