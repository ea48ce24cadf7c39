"""``sensorium-poller``: run the DeferredOperationPoller."""

from __future__ import annotations

import sys

from sensorium.poller.service import serve
from sensorium.shared.process import parse_common, run_service


def main(argv: list[str] | None = None) -> int:
    args = parse_common("sensorium-poller", "The Sensorium DeferredOperationPoller.", argv)
    return run_service("poller", args.state_dir, serve)


if __name__ == "__main__":
    sys.exit(main())
