"""Waiting for a restarted process to serve again, so that `sensorium restart` returns
when the next command can use it (as `systemctl restart` does for a notify unit)."""

from __future__ import annotations

import time

from sensorium.client.api import Client
from sensorium.client.cli.node import Node, endpoint_of, probe
from sensorium.shared.errors import CodedError

POLL_S = 0.1
POLLS = 600  # 60 s at most: a connector's start (canaries, catalog) fits with room


def state_before(node: Node, process: str) -> tuple[str | None, str | None]:
    """The serving instance's probe token now, and the connector instance core has a
    report from (None when nobody answers)."""
    reply = probe(endpoint_of(process, node.cfg, node.paths))
    return (None if reply is None else reply.token), _reported_connector(node)


def _reported_connector(node: Node) -> str | None:
    try:
        with Client(state_dir=str(node.paths.root), connect_timeout_s=0.5) as client:
            health = client.health()
    except CodedError:
        return None
    seen = health.connector
    return seen.instance_id if seen is not None and seen.connected else None


def wait_restarted(node: Node, process: str, before: tuple[str | None, str | None]) -> str | None:
    """None once a new instance of ``process`` answers on its socket (and, for the
    connector, core has its report: its catalog is resolved); else what is missing."""
    endpoint = endpoint_of(process, node.cfg, node.paths)
    if not endpoint.startswith("ipc://"):
        return None  # a tcp endpoint needs a client key to probe: nothing to wait on
    token, reported = before
    for _ in range(POLLS):
        reply = probe(endpoint)
        serving = reply is not None and reply.token != token and not reply.closing
        if serving and process != "connector":
            return None
        if serving and _reported_connector(node) not in (None, reported):
            return None
        time.sleep(POLL_S)
    return f"{process} did not serve again within {POLL_S * POLLS:.0f} s; `sensorium status`"
