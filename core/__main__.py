"""``sensorium-core``: run the front door."""

from __future__ import annotations

import sys

from sensorium.core.process import serve
from sensorium.shared.process import parse_common, run_service


def main(argv: list[str] | None = None) -> int:
    args = parse_common("sensorium-core", "The Sensorium core process.", argv)
    return run_service("core", args.state_dir, serve)


if __name__ == "__main__":
    sys.exit(main())
