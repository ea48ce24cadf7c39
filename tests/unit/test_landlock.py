"""Landlock on the real kernel: a forked child restricts itself, probes, and reports back.

The child runs only syscalls and ``os._exit``; every probe is an errno (0: it worked).
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from forked import errno_of, in_child

from sensorium.connectors.os.run.sandbox import landlock

ABI = landlock.abi_version()
READ = ["/usr", *sorted(glob.glob("/lib*"))]

needs_abi = pytest.mark.skipif(ABI < 1, reason="this kernel has no Landlock (ABI 0)")
needs_net = pytest.mark.skipif(ABI < 4, reason=f"Landlock ABI {ABI} < 4: no TCP rules")
needs_scopes = pytest.mark.skipif(ABI < 6, reason=f"Landlock ABI {ABI} < 6: no scopes")


def _read(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 1)
    finally:
        os.close(fd)


def _create_and_delete(path: str) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b"x")
    os.close(fd)
    os.unlink(path)


def _mkdir_and_remove(path: str) -> None:
    os.mkdir(path)
    os.rmdir(path)


def _connect(address: Any, family: int = socket.AF_INET) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(address)


def _bind_tcp() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))


def _usr_file() -> str:
    for root, _, files in os.walk("/usr/share"):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path) and os.path.isfile(path) and os.path.getsize(path):
                return path
    raise AssertionError("no regular file under /usr/share to probe with")


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s
    finally:
        s.close()


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    name = f"\0sensorium-landlock-{os.getpid()}-{secrets.token_hex(4)}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(name)
        s.listen(8)
        yield name
    finally:
        s.close()


def test_handled_rights_grow_with_the_abi() -> None:
    assert landlock.handled_fs(0) == 0
    assert landlock.handled_fs(1) == (1 << 13) - 1
    assert landlock.handled_fs(2) == landlock.handled_fs(1) | landlock.ACCESS_FS_REFER
    assert landlock.handled_fs(3) == landlock.handled_fs(2) | landlock.ACCESS_FS_TRUNCATE
    assert landlock.handled_fs(4) == landlock.handled_fs(3)
    assert landlock.handled_fs(5) == landlock.handled_fs(4) | landlock.ACCESS_FS_IOCTL_DEV
    assert landlock.handled_fs(landlock.KNOWN_ABI) == (1 << 16) - 1
    assert landlock.handled_net(3) == 0
    assert landlock.handled_net(4) == landlock.ACCESS_NET_BIND_TCP | landlock.ACCESS_NET_CONNECT_TCP
    assert landlock.handled_scopes(5) == 0
    assert landlock.handled_scopes(6) == (
        landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL
    )


def test_struct_layouts_match_the_uapi() -> None:
    assert ctypes.sizeof(landlock._PathBeneathAttr) == 12  # packed
    assert ctypes.sizeof(landlock._NetPortAttr) == 16
    assert ctypes.sizeof(landlock._RulesetAttr) == 24
    assert [landlock.ruleset_size(a) for a in (1, 3, 4, 5, 6, 7)] == [8, 8, 16, 16, 24, 24]


def test_abi_zero_is_refused_before_anything_is_restricted() -> None:
    with pytest.raises(OSError, match="Landlock is not available") as info:
        landlock.restrict_self(read=[], full=[], tcp_connect_ports=None, abi=0)
    assert info.value.errno == errno.ENOSYS


@needs_abi
def test_an_abi_newer_than_the_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="kernel speaks only"):
        landlock.restrict_self(read=[], full=[], tcp_connect_ports=None, abi=ABI + 1)


@needs_abi
def test_filesystem_grants(tmp_path: Path) -> None:
    full, other = tmp_path / "full", tmp_path / "other"
    full.mkdir()
    other.mkdir()
    (other / "secret").write_text("s")
    (full / "moved").write_text("m")
    (full / "sub").mkdir()
    usr_file = _usr_file()
    usr_new = f"/usr/sensorium-landlock-probe-{os.getpid()}"

    def probe() -> dict[str, Any]:
        result = landlock.restrict_self(read=READ, full=[str(full)], tcp_connect_ports=None)
        return {
            "abi": result.abi,
            "handled_fs": result.handled_fs,
            "skipped": list(result.skipped),
            "read other": errno_of(lambda: _read(str(other / "secret"))),
            "list other": errno_of(lambda: os.listdir(other)),
            "write usr file": errno_of(lambda: os.close(os.open(usr_file, os.O_WRONLY))),
            "create in usr": errno_of(lambda: _create_and_delete(usr_new)),
            "read usr file": errno_of(lambda: _read(usr_file)),
            "list usr": errno_of(lambda: os.listdir("/usr")),
            "create in full": errno_of(lambda: _create_and_delete(str(full / "new"))),
            "mkdir in full": errno_of(lambda: _mkdir_and_remove(str(full / "d"))),
            "rename out of full": errno_of(lambda: os.rename(full / "moved", other / "moved")),
            "rename within full": errno_of(lambda: os.rename(full / "moved", full / "sub" / "m")),
        }

    try:
        report = in_child(probe)
    finally:
        if os.path.exists(usr_new):
            os.unlink(usr_new)
    assert report["abi"] == ABI
    assert report["handled_fs"] == landlock.handled_fs(ABI)
    assert report["skipped"] == []
    for denied in ("read other", "list other", "write usr file", "create in usr"):
        assert report[denied] == errno.EACCES, denied
    for allowed in ("read usr file", "list usr", "create in full", "mkdir in full"):
        assert report[allowed] == 0, allowed
    # EXDEV when only REFER is missing; EACCES when the target grants nothing at all.
    assert report["rename out of full"] in (errno.EXDEV, errno.EACCES)
    assert not (other / "moved").exists()
    assert report["rename within full"] == 0
    assert (full / "sub" / "m").exists()


@needs_abi
def test_files_symlinks_and_absent_paths(tmp_path: Path) -> None:
    readable, writable = tmp_path / "readable", tmp_path / "writable"
    readable.write_text("r")
    writable.write_text("w")
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    missing = str(tmp_path / "missing")

    def probe() -> dict[str, Any]:
        # Files get full rights masked to what a file can carry (else EINVAL).
        result = landlock.restrict_self(
            read=[str(readable), missing], full=[str(writable), str(link)], tcp_connect_ports=[]
        )
        return {
            "skipped": list(result.skipped),
            "read readable": errno_of(lambda: _read(str(readable))),
            "write readable": errno_of(lambda: os.close(os.open(readable, os.O_WRONLY))),
            "append writable": errno_of(lambda: os.close(os.open(writable, os.O_WRONLY))),
            "create in target": errno_of(lambda: _create_and_delete(str(target / "n"))),
        }

    report = in_child(probe)
    assert report == {
        "skipped": [missing],
        "read readable": 0,
        "write readable": errno.EACCES,
        "append writable": 0,
        "create in target": 0,
    }


@needs_net
def test_tcp_bind_is_denied_and_connect_needs_a_listed_port(
    tcp_listener: socket.socket,
) -> None:
    port = tcp_listener.getsockname()[1]

    def probe(ports: list[int] | None) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            result = landlock.restrict_self(read=READ, full=[], tcp_connect_ports=ports)
            return {
                "net_handled": result.net_handled,
                "connect": errno_of(lambda: _connect(("127.0.0.1", port))),
                "bind": errno_of(_bind_tcp),
            }

        return run

    assert in_child(probe(None)) == {
        "net_handled": True,
        "connect": errno.EACCES,
        "bind": errno.EACCES,
    }
    assert in_child(probe([port]))["connect"] == 0
    assert in_child(probe([port + 1 if port < 65535 else port - 1]))["connect"] == errno.EACCES


@needs_scopes
def test_signals_and_abstract_sockets_stay_inside_the_domain(abstract_listener: str) -> None:
    parent = os.getpid()

    def probe() -> dict[str, Any]:
        result = landlock.restrict_self(read=READ, full=[], tcp_connect_ports=None)
        return {
            "scoped": result.scoped,
            "kill parent": errno_of(lambda: os.kill(parent, 0)),
            "kill self": errno_of(lambda: os.kill(os.getpid(), 0)),
            "abstract connect": errno_of(lambda: _connect(abstract_listener, socket.AF_UNIX)),
        }

    assert in_child(probe) == {
        "scoped": True,
        "kill parent": errno.EPERM,
        "kill self": 0,
        "abstract connect": errno.EPERM,
    }


@needs_abi
def test_an_older_abi_handles_only_what_it_knows(
    tcp_listener: socket.socket, abstract_listener: str
) -> None:
    port = tcp_listener.getsockname()[1]
    parent = os.getpid()

    def probe() -> dict[str, Any]:
        result = landlock.restrict_self(read=READ, full=[], tcp_connect_ports=None, abi=3)
        return {
            "result": [result.abi, result.handled_fs, result.scoped, result.net_handled],
            "connect": errno_of(lambda: _connect(("127.0.0.1", port))),
            "kill parent": errno_of(lambda: os.kill(parent, 0)),
            "abstract connect": errno_of(lambda: _connect(abstract_listener, socket.AF_UNIX)),
        }

    assert in_child(probe) == {
        "result": [3, landlock.handled_fs(3), False, False],
        "connect": 0,
        "kill parent": 0,
        "abstract connect": 0,
    }
