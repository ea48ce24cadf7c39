"""``sensorium-supervisor``: run the three processes in the foreground."""

from __future__ import annotations

import sys

from sensorium.shared.process import parse_common
from sensorium.supervisor.run import run_foreground


def main(argv: list[str] | None = None) -> int:
    args = parse_common("sensorium-supervisor", "Run and watch Sensorium's processes.", argv)
    return run_foreground(args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
