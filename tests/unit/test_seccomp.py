"""The seccomp deny-list on the real kernel: a forked child installs it, probes, reports back.

The child runs only syscalls and ``os._exit``; every probe is an errno (0: it worked).
Arguments are chosen so that a call the filter failed to stop would still do no harm.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from forked import errno_of, in_child

from sensorium.connectors.os.run.sandbox import seccomp

pytestmark = pytest.mark.skipif(
    not seccomp.available(), reason="this kernel has no seccomp filter mode or libseccomp"
)

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc["syscall"]
_syscall.argtypes = (ctypes.c_long, *(ctypes.c_ulong,) * 6)
_syscall.restype = ctypes.c_long
_ioctl = _libc["ioctl"]
_ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_ioctl.restype = ctypes.c_int

_ALL_ONES = (1 << 64) - 1
_CLONE_NEWUTS = 0x04000000
_PTRACE_TRACEME = 0
_PTRACE_ATTACH = 16
_ADDR_NO_RANDOMIZE = 0x0040000


def _nr(name: str) -> int:
    import pyseccomp

    nr: int = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    assert nr >= 0, f"{name} is unknown on this architecture"
    return nr


def _call(name: str, *args: int) -> int:
    """The raw syscall's errno (0: it succeeded); unused arguments are zero."""
    padded = [a & _ALL_ONES for a in args] + [0] * (6 - len(args))
    rc = _syscall(_nr(name), *padded)
    return ctypes.get_errno() if rc == -1 else 0


def _open_close(family: int) -> None:
    socket.socket(family).close()


def _pair_close(family: int) -> None:
    for s in socket.socketpair(family):
        s.close()


def _install(allow_unix_sockets: bool) -> Callable[[], None]:
    # Built in the parent, as the connector does: the child only loads it.
    f = seccomp.build_filter(allow_unix_sockets=allow_unix_sockets)
    return lambda: seccomp.install(f)


def test_the_published_list_names_what_is_denied() -> None:
    assert "io_uring_setup" in seccomp.DENIED
    assert "clone3" in seccomp.DENIED
    assert seccomp.denied(allow_unix_sockets=True) == seccomp.DENIED
    assert seccomp.denied(allow_unix_sockets=False) == (
        seccomp.DENIED + seccomp.DENIED_UNIX_SOCKETS
    )
    assert seccomp.unsupported() == ()


def test_a_name_the_architecture_lacks_is_skipped_not_fatal() -> None:
    import pyseccomp

    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    assert seccomp._deny(f, pyseccomp.ERRNO(errno.EPERM), "no_such_syscall") is False
    assert seccomp._deny(f, pyseccomp.ERRNO(errno.EPERM), "bpf") is True


def test_escape_calls_fail_with_eperm(tmp_path: Path) -> None:
    install = _install(allow_unix_sockets=False)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:

        def probe() -> dict[str, Any]:
            install()
            # All-ones arguments: invalid for every call, should one get through.
            report = {name: _call(name, *[-1] * 6) for name in seccomp._ALWAYS}
            report["io_uring_setup(1, NULL)"] = _call("io_uring_setup", 1, 0)
            report["unshare(NEWUTS)"] = _call("unshare", _CLONE_NEWUTS)
            # ATTACH first: a traced child would stop on the SIGCHLD of the stopped sleeper.
            report["ptrace(ATTACH)"] = _call("ptrace", _PTRACE_ATTACH, sleeper.pid)
            report["ptrace(TRACEME)"] = _call("ptrace", _PTRACE_TRACEME)
            return report

        report = in_child(probe)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert {k: v for k, v in report.items() if v != errno.EPERM} == {}


def test_clone_with_a_namespace_flag_is_denied_and_clone3_reports_enosys() -> None:
    install = _install(allow_unix_sockets=False)

    def probe() -> dict[str, Any]:
        install()
        pid = _syscall(_nr("clone"), _CLONE_NEWUTS | signal.SIGCHLD, 0, 0, 0, 0, 0)
        if pid == 0:  # the filter let it through: this is a new process
            os._exit(0)
        if pid > 0:
            os.waitpid(pid, 0)
        return {
            "clone(NEWUTS)": ctypes.get_errno() if pid == -1 else 0,
            "clone3": _call("clone3", 0, 0),
        }

    assert in_child(probe) == {"clone(NEWUTS)": errno.EPERM, "clone3": errno.ENOSYS}


def test_fork_threads_and_file_io_still_work(tmp_path: Path) -> None:
    install = _install(allow_unix_sockets=False)
    path = tmp_path / "data"

    def fork_and_wait() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def thread_ran() -> bool:
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(1))
        t.start()  # glibc tries clone3 first and falls back to clone on ENOSYS
        t.join(2)
        return seen == [1]

    def file_io() -> str:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        os.write(fd, b"hello")
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 5)
        os.close(fd)
        return data.decode()

    def probe() -> dict[str, Any]:
        install()
        return {
            "fork exit code": fork_and_wait(),
            "thread ran": thread_ran(),
            "file": file_io(),
            "inet socket": errno_of(lambda: _open_close(socket.AF_INET)),
        }

    assert in_child(probe) == {
        "fork exit code": 7,
        "thread ran": True,
        "file": "hello",
        "inet socket": 0,
    }


@pytest.mark.parametrize("allow", [False, True])
def test_unix_sockets_follow_the_class(allow: bool) -> None:
    install = _install(allow_unix_sockets=allow)

    def probe() -> dict[str, Any]:
        install()
        return {
            "socket": errno_of(lambda: _open_close(socket.AF_UNIX)),
            "socketpair": errno_of(lambda: _pair_close(socket.AF_UNIX)),
        }

    expected = 0 if allow else errno.EPERM
    assert in_child(probe) == {"socket": expected, "socketpair": expected}


def test_tty_injection_ioctls_are_denied_whatever_the_upper_bits() -> None:
    install = _install(allow_unix_sockets=True)

    def ioctl(cmd: int) -> int:
        fd = os.open("/dev/null", os.O_RDONLY)
        try:
            byte = ctypes.c_char(b"x")
            return 0 if _ioctl(fd, cmd, ctypes.addressof(byte)) == 0 else ctypes.get_errno()
        finally:
            os.close(fd)

    def probe() -> dict[str, Any]:
        install()
        return {
            "TIOCSTI": ioctl(0x5412),
            "TIOCSTI with upper bits": ioctl((1 << 32) | 0x5412),
            "TIOCLINUX": ioctl(0x541C),
            "FIONREAD": ioctl(0x541B),  # not denied: /dev/null answers ENOTTY itself
        }

    assert in_child(probe) == {
        "TIOCSTI": errno.EPERM,
        "TIOCSTI with upper bits": errno.EPERM,
        "TIOCLINUX": errno.EPERM,
        "FIONREAD": errno.ENOTTY,
    }


def test_personality_allows_only_the_default_and_the_query() -> None:
    install = _install(allow_unix_sockets=True)

    def probe() -> dict[str, Any]:
        install()
        return {
            "query": _call("personality", 0xFFFFFFFF),
            "default": _call("personality", 0),
            "no randomize": _call("personality", _ADDR_NO_RANDOMIZE),
            "no randomize, upper bits": _call("personality", (1 << 32) | _ADDR_NO_RANDOMIZE),
            "top bit": _call("personality", 1 << 31),
        }

    assert in_child(probe) == {
        "query": 0,
        "default": 0,
        "no randomize": errno.EPERM,
        "no randomize, upper bits": errno.EPERM,
        "top bit": errno.EPERM,
    }


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 exists only on x86_64")
def test_a_call_through_the_x32_table_kills_the_caller() -> None:
    install = _install(allow_unix_sockets=True)
    pid = os.fork()
    if pid == 0:
        try:
            install()
            _syscall(0x40000000 | 39, 0, 0, 0, 0, 0, 0)  # x32 getpid
        finally:
            os._exit(0)  # only reached if it survived
    try:
        _, status = os.waitpid(pid, 0)
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still ours
        os.waitpid(pid, 0)
        raise
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS


def test_the_precompiled_program_denies_what_the_filter_does() -> None:
    """The zygote hands sandboxes the program compiled once; it must refuse the same."""
    program = seccomp.compile_program(seccomp.build_filter(allow_unix_sockets=False))
    assert program and len(program) % 8 == 0

    def probe() -> dict[str, Any]:
        seccomp.install_program(program)
        report = {name: _call(name, *[-1] * 6) for name in seccomp._ALWAYS}
        report["unshare(NEWUTS)"] = _call("unshare", _CLONE_NEWUTS)
        report["socket(AF_UNIX)"] = errno_of(lambda: _open_close(socket.AF_UNIX))
        with open("/proc/self/status") as status:
            mode = next(line for line in status if line.startswith("Seccomp:"))
        report["mode"] = mode.split()[1]
        report["getpid"] = 0 if os.getpid() > 0 else -1
        return report

    report = in_child(probe)
    assert report.pop("mode") == "2"
    assert report.pop("getpid") == 0
    assert {k: v for k, v in report.items() if v != errno.EPERM} == {}
