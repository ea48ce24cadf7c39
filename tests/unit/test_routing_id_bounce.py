"""Dropping an id's holder once (``RoutingIds._bounce``): only the very socket seen
opened, acted on through a duplicate of its descriptor, never the descriptor itself."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from sensorium.shared.rpc.identities import RoutingIds


@pytest.fixture
def ids() -> Iterator[RoutingIds]:
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    ids = RoutingIds(router, "test")
    try:
        yield ids
    finally:
        ids.close()
        router.close(linger=0)
        ctx.term()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_holder_seen_opened_is_shut_down_and_its_descriptor_left_open(
    ids: RoutingIds,
) -> None:
    holder, peer = socket.socketpair()
    with holder, peer:
        fd = holder.fileno()
        ids._open[fd] = os.fstat(fd).st_ino
        before = _open_fds()
        assert ids._bounce(fd) is True
        assert _open_fds() == before  # the duplicate it acted on is closed again
        assert peer.recv(1) == b""  # the connection ended, for the peer too
        os.fstat(fd)  # the descriptor is still open: its owner (libzmq) closes it


def test_a_number_now_naming_another_file_is_left_alone(ids: RoutingIds) -> None:
    other, peer = socket.socketpair()
    with other, peer:
        fd = other.fileno()
        ids._open[fd] = os.fstat(fd).st_ino + 1  # the socket once seen there was another
        before = _open_fds()
        assert ids._bounce(fd) is False
        assert _open_fds() == before
        other.sendall(b"x")
        assert peer.recv(1) == b"x"  # still connected


def test_a_descriptor_closed_already_is_not_bounced(ids: RoutingIds) -> None:
    holder, peer = socket.socketpair()
    with peer:
        fd = holder.fileno()
        ids._open[fd] = os.fstat(fd).st_ino
        holder.close()
        assert ids._bounce(fd) is False
