"""``sensorium-os``: run the OS connector."""

from __future__ import annotations

import sys

from sensorium.connectors.os.process import serve
from sensorium.shared.process import parse_common, run_service


def main(argv: list[str] | None = None) -> int:
    args = parse_common("sensorium-os", "The Sensorium OS connector.", argv)
    return run_service("connector", args.state_dir, serve)


if __name__ == "__main__":
    sys.exit(main())
