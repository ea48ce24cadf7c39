"""Network and process escapes from a real sandbox: each attempt fails, nothing outside moves.

Every program prints a JSON report of what it tried and what the kernel answered;
each test asserts on that report AND on the world outside the envelope (host
listeners that must stay silent, the connector's pid and liveness, survivors in
the host's process table).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import select
import shutil
import socket
import tempfile
import threading
import time
import tty
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from harness import ACTION_PYTHON, PROGRAMS, Stack, python_action, running_stack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel envelopes need root here")

SANDBOX_UID = 65534
STDOUT_CAP = 65536
MAX_PROCESSES = 256  # the node config's sandbox.max_processes default (RLIMIT_NPROC)
PER_CONN_CAP = 1024
TOTAL_CAP = 1536
NET_ACTIONS = ("esc.net.c1", "esc.net.c2", "esc.net.c3", "esc.net.c5")

# Tries every way out of a network-less namespace; targets are formatted in.
NET_PROBE = """\
import json, socket, sys

TCP_PORT = {tcp_port}
UDP_PORT = {udp_port}
HOST_IP = {host_ip!r}
UNIX_PATH = {unix_path!r}
ABSTRACT = {abstract!r}
report = {{}}


def attempt(name, fn):
    try:
        fn()
        report[name] = {{"ok": True}}
    except BaseException as exc:
        err = getattr(exc, "errno", None)
        report[name] = {{"ok": False, "error": type(exc).__name__, "errno": err}}


def tcp(host, port):
    def go():
        with socket.create_connection((host, port), timeout=2) as s:
            s.sendall(b"escaped")
    return go


def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"escaped", ("127.0.0.1", UDP_PORT))


def raw():
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.sendto(b"\\x08\\0\\0\\0\\0\\0\\0\\0", ("127.0.0.1", 0))


def unix(address):
    def go():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(address)
            s.sendall(b"escaped")
    return go


attempt("tcp_loopback", tcp("127.0.0.1", TCP_PORT))
attempt("tcp_unroutable", tcp("10.255.255.1", 80))
if HOST_IP:
    attempt("tcp_host_ip", tcp(HOST_IP, TCP_PORT))
attempt("udp_loopback", udp)
attempt("raw_socket", raw)
attempt("unix_path", unix(UNIX_PATH))
attempt("unix_abstract", unix(ABSTRACT))
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
print(json.dumps(report))
"""

# The C1 process-escape program: one mode per escape, ``arg`` its parameter or marker.
PROC_PROBE = """\
import ctypes, errno, fcntl, json, os, signal, sys, termios, time

mode, arg = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
report = {}


def outcome(fn):
    try:
        r = fn()
        return {"ok": True, "value": r}
    except BaseException as exc:
        return {"ok": False, "error": type(exc).__name__, "errno": getattr(exc, "errno", None)}


def call(name, *args):
    ctypes.set_errno(0)
    rc = getattr(libc, name)(*args)
    return {"rc": rc, "errno": ctypes.get_errno()}


if mode == "tiocsti":
    for fd in (0, 1, 2):
        report[f"fd{fd}"] = outcome(lambda fd=fd: fcntl.ioctl(fd, termios.TIOCSTI, b"x"))
    report["dev_tty"] = outcome(lambda: os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    try:
        fd = os.open(arg, os.O_RDONLY | os.O_NOCTTY)
    except OSError as exc:
        report["host_pty_open"] = {"ok": False, "errno": exc.errno}
    else:
        report["host_pty_open"] = {"ok": True}
        report["host_pty_inject"] = [
            outcome(lambda c=c: fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))) for c in b"id\\n"
        ]
elif mode == "fds":
    fds = sorted(int(x) for x in os.listdir("/proc/self/fd"))
    report["fds"] = fds
    report["targets"] = {}
    for fd in fds:
        try:
            report["targets"][fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError as exc:
            report["targets"][fd] = exc.errno
elif mode == "environ":
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    report["pids"] = pids
    readable = {}
    leaked = []
    for pid in sorted(set(pids) | {int(arg)}):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError as exc:
            readable[pid] = exc.errno
            continue
        readable[pid] = "read"
        if b"SENSORIUM_" in env:
            leaked.append(pid)
    report["environ"] = readable
    report["leaked"] = leaked
elif mode == "kill":
    report["targets"] = {
        p: outcome(lambda p=p: os.kill(int(p), signal.SIGKILL)) for p in arg.split(",")
    }
    report["init"] = outcome(lambda: os.kill(1, signal.SIGKILL))
    report["everyone"] = outcome(lambda: os.kill(-1, signal.SIGKILL))
    report["alive"] = True
elif mode == "io_uring":
    params = ctypes.create_string_buffer(120)
    libc.syscall.restype = ctypes.c_long
    report["io_uring_setup"] = call("syscall", ctypes.c_long(425), ctypes.c_long(8), params)
elif mode == "ptrace":
    libc.ptrace.restype = ctypes.c_long
    args = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
    libc.ptrace.argtypes = args
    report["traceme"] = call("ptrace", 0, 0, None, None)
    report["attach_init"] = call("ptrace", 16, 1, None, None)
elif mode == "unshare":
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    report["newuser"] = call("unshare", 0x10000000)
    report["newns"] = call("unshare", 0x00020000)
    report["mount"] = call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
elif mode == "ids":
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\\n").split(":\\t", 1) for line in f if ":\\t" in line)
    report["uid"] = os.getresuid()
    report["gid"] = os.getresgid()
    report["groups"] = os.getgroups()
    report["caps"] = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
    report["no_new_privs"] = status.get("NoNewPrivs")
    report["seccomp"] = status.get("Seccomp")
elif mode == "forkbomb":
    forks = 0
    for _ in range(4 * 256):
        try:
            pid = os.fork()
        except OSError as exc:
            report["stopped_by"] = exc.errno
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        forks += 1
    report["forks"] = forks
elif mode in ("setsid", "setsid-hold"):
    r, w = os.pipe()
    if os.fork() == 0:
        gc = os.fork()
        if gc == 0:
            os.setsid()
            time.sleep(60)  # holds stdout and stderr too
            os._exit(0)
        os.write(w, str(gc).encode())
        os._exit(0)
    os.close(w)
    report["grandchild"] = int(os.read(r, 64))
    print(json.dumps(report), flush=True)
    if mode == "setsid-hold":
        time.sleep(60)
    sys.exit(0)
elif mode == "flood":
    chunk = b"x" * (1 << 20)
    for _ in range(50):
        sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    sys.stderr.write("flood done\\n")
    sys.exit(0)
print(json.dumps(report))
"""

# C4: each mode tries one way past the relay's declared (host, port) and its caps.
EGRESS_PROBE = """\
import json, socket, sys

P = {port}
Q = {stray}
mode = sys.argv[1]
report = {{}}


def outcome(fn):
    try:
        return {{"ok": True, "value": fn()}}
    except BaseException as exc:
        return {{"ok": False, "error": type(exc).__name__, "errno": getattr(exc, "errno", None)}}


def exchange(addr, payload):
    with socket.create_connection(addr, timeout=3) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return len(got)
            got += chunk


if mode == "declared":
    report["declared"] = outcome(lambda: exchange(("localhost", P), b"hello"))
elif mode == "undeclared-port":
    report["by_name"] = outcome(lambda: exchange(("localhost", Q), b"stray"))
    report["by_ip"] = outcome(lambda: exchange(("127.0.0.1", Q), b"stray"))
elif mode == "undeclared-name":
    report["resolve"] = outcome(lambda: socket.getaddrinfo("undeclared.example", P))
    report["connect"] = outcome(lambda: exchange(("undeclared.example", P), b"named"))
elif mode == "direct-ip":
    report["ip2"] = outcome(lambda: exchange(("127.0.0.2", P), b"smuggled"))
    report["ip1"] = outcome(lambda: exchange(("127.0.0.1", P), b"smuggled"))
elif mode == "per-conn-cap":
    report["big"] = outcome(lambda: exchange(("localhost", P), b"a" * 8192))
elif mode == "total-cap":
    report["first"] = outcome(lambda: exchange(("localhost", P), b"b" * 1000))
    report["second"] = outcome(lambda: exchange(("localhost", P), b"c" * 1000))
print(json.dumps(report))
"""


def _shared_dir(prefix: str, owner: int | None = None, mode: int = 0o755) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    d.chmod(mode)
    if owner is not None:
        os.chown(d, owner, owner)
    return d


def _write_program(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def _decl(
    action_id: str,
    program: str,
    argv: list[str] | None = None,
    props: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A C1 declaration running the probe at ``program``, with short timeouts."""
    extra = {"default_timeout_ms": 5000, "max_timeout_ms": 10_000, **extra}
    return python_action(action_id, program, argv, props, **extra)


def _host_ip() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def _pending(sock: socket.socket) -> bool:
    """Whether a connection or datagram is waiting on a host-side socket."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class Sink:
    """A TCP server on host loopback that records every byte of every connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.conns: list[bytearray] = []
        self.open = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = bytearray()
            with self.lock:
                self.conns.append(data)
                self.open += 1
            threading.Thread(target=self._read, args=(conn, data), daemon=True).start()

    def _read(self, conn: socket.socket, data: bytearray) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while chunk := conn.recv(65536):
                    with self.lock:
                        data += chunk
            except OSError:
                pass
        with self.lock:
            self.open -= 1

    def clear(self) -> None:
        with self.lock:
            self.conns.clear()

    def settled(self) -> list[bytes]:
        """What each connection delivered, once every connection has ended (≤ 3 s)."""
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            with self.lock:
                if self.open == 0:
                    break
            time.sleep(0.02)
        with self.lock:
            return [bytes(c) for c in self.conns]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    made: list[Path] = []
    socks: list[socket.socket] = []
    sink = Sink()
    try:
        # Bound to every host address: catches loopback and the host's own IP.
        tcp = socket.create_server(("0.0.0.0", 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        socks += [tcp, udp, unix, abstract]
        stray = socket.create_server(("127.0.0.1", 0))
        socks.append(stray)
        udp.bind(("0.0.0.0", 0))
        unix_dir = _shared_dir("sensorium-adv-unix-", mode=0o777)
        made.append(unix_dir)
        unix_path = str(unix_dir / "sock")
        unix.bind(unix_path)
        os.chmod(unix_path, 0o777)
        unix.listen()
        abstract_name = f"\0sensorium-adv-{uuid.uuid4().hex}"
        abstract.bind(abstract_name)
        abstract.listen()
        for s in socks:
            s.setblocking(False)
        scripts = _shared_dir("sensorium-adv-scripts-")
        write_root = _shared_dir("sensorium-adv-wr-", owner=SANDBOX_UID)
        made += [scripts, write_root]
        net_probe = scripts / "net_probe.py"
        _write_program(
            net_probe,
            NET_PROBE.format(
                tcp_port=tcp.getsockname()[1],
                udp_port=udp.getsockname()[1],
                host_ip=_host_ip(),
                unix_path=unix_path,
                abstract=abstract_name,
            ),
        )
        yield {
            "scripts": scripts,
            "write_root": write_root,
            "net_probe": net_probe,
            "listeners": {"tcp": tcp, "udp": udp, "unix": unix, "abstract": abstract},
            "stray": stray,
            "sink": sink,
        }
    finally:
        sink.close()
        for s in socks:
            s.close()
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(world: dict[str, Any]) -> Iterator[Stack]:
    probe = str(world["net_probe"])
    proc_probe = _write_program(PROGRAMS / "esc_proc_probe.py", PROC_PROBE)
    egress_probe = _write_program(
        PROGRAMS / "esc_egress_probe.py",
        EGRESS_PROBE.format(port=world["sink"].port, stray=world["stray"].getsockname()[1]),
    )
    actions = [
        _decl("esc.net.c1", probe),
        {
            **_decl("esc.net.c2", probe, ["--params-json", "{{params_json}}"]),
            "class": "allowlisted-script",
            "executable": {
                "kind": "script",
                "path": probe,
                "interpreter": ACTION_PYTHON,
                "argv_shape": ["python3", probe, "--params-json", "{{params_json}}"],
                "sha256": hashlib.sha256(world["net_probe"].read_bytes()).hexdigest(),
            },
            "script": {"allowed_roots": [str(world["scripts"])]},
        },
        {
            **_decl("esc.net.c3", probe),
            "class": "scoped-fs-write",
            "fs_write": {
                "write_root": str(world["write_root"]),
                "max_bytes_total": 1 << 20,
                "max_bytes_per_file": 1 << 16,
            },
        },
        {
            **_decl("esc.net.c5", probe),
            "class": "artifact-producing-spawn",
            "artifact": {
                "max_count": 4,
                "max_bytes_per": 1024,
                "max_bytes_total": 4096,
                "allowed_media_types": ["text/plain"],
            },
        },
        _decl(
            "esc.proc",
            proc_probe,
            ["{{mode}}", "{{arg}}"],
            {"mode": {"type": "string"}, "arg": {"type": "string"}},
            limits={"stdout_max_bytes": STDOUT_CAP, "stderr_max_bytes": STDOUT_CAP},
        ),
        {
            **_decl("esc.egress", egress_probe, ["{{mode}}"], {"mode": {"type": "string"}}),
            "class": "egress-network-spawn",
            "egress_network": {
                "endpoints": [{"host": "localhost", "port": world["sink"].port, "protocol": "tcp"}],
                "max_bytes_total": TOTAL_CAP,
                "max_bytes_per_connection": PER_CONN_CAP,
            },
        },
    ]
    with running_stack(actions) as s:
        yield s


def _run(stack: Stack, action_id: str, params: dict[str, Any], **kw: Any) -> Any:
    with stack.client() as c:
        return c.invoke(action_id, params, **kw)


def _proc(stack: Stack, mode: str, arg: str = "none", **kw: Any) -> tuple[Any, dict[str, Any]]:
    out = _run(stack, "esc.proc", {"mode": mode, "arg": arg}, **kw)
    assert out.status == "completed", (out.status, out.stderr.text, out.diagnostics)
    return out, json.loads(out.stdout.text)


def _stack_pids(stack: Stack) -> dict[str, int | None]:
    return {**stack.pids(), "supervisor": stack.proc.pid}


def _assert_stack_intact(stack: Stack, before: dict[str, int | None]) -> None:
    """Same processes, every one alive, and the connector still runs actions."""
    assert _stack_pids(stack) == before
    for name, pid in before.items():
        assert pid is not None and psutil.pid_exists(pid), name
    _out, seen = _proc(stack, "ids")
    assert seen["uid"] == [SANDBOX_UID] * 3


def _marked(marker: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or ()):
            found.append(p.pid)
    return found


def _none_marked(marker: str, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _assert_failed(report: dict[str, Any]) -> None:
    succeeded = [name for name, r in report.items() if r["ok"]]
    assert not succeeded, report


# --- 1. network from every class without an egress effect ---------------------


@pytest.mark.parametrize("action_id", NET_ACTIONS)
def test_no_network_without_the_egress_effect(
    stack: Stack, world: dict[str, Any], action_id: str
) -> None:
    out = _run(stack, action_id, {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    report = json.loads(out.stdout.text)
    expected = {
        "tcp_loopback",
        "tcp_unroutable",
        "udp_loopback",
        "raw_socket",
        "unix_path",
        "unix_abstract",
        "dns",
    }
    assert expected <= set(report), report
    _assert_failed(report)
    # AF_UNIX sockets are refused by seccomp before any address is looked at.
    assert report["unix_path"]["errno"] == errno.EPERM
    assert report["unix_abstract"]["errno"] == errno.EPERM
    assert report["raw_socket"]["errno"] == errno.EPERM
    assert report["dns"]["error"] == "gaierror"
    for name, sock in world["listeners"].items():
        assert not _pending(sock), f"the host's {name} listener received something"
    assert not out.network_transcript


# --- 2. C4: only the declared endpoint, within its caps -----------------------


def _egress(
    stack: Stack, world: dict[str, Any], mode: str, status: str = "completed"
) -> tuple[Any, dict[str, Any]]:
    """Run one C4 mode; an envelope violation turns a clean exit into ``failed``."""
    world["sink"].clear()
    out = _run(stack, "esc.egress", {"mode": mode})
    assert (out.status, out.exit_code) == (status, 0), (out.stderr.text, out.diagnostics)
    return out, json.loads(out.stdout.text)


def _violations(out: Any) -> list[str]:
    return [d.message for d in out.diagnostics if d.code == "envelope-violation"]


def test_c4_declared_endpoint_is_reachable(stack: Stack, world: dict[str, Any]) -> None:
    """The control: the relay works, so the refusals below are the envelope's doing."""
    out, report = _egress(stack, world, "declared")
    assert report["declared"] == {"ok": True, "value": 0}
    assert world["sink"].settled() == [b"hello"]
    [row] = out.network_transcript
    assert (row.host, row.port, row.bytes_sent) == ("localhost", world["sink"].port, 5)


def test_c4_undeclared_port_is_unreachable(stack: Stack, world: dict[str, Any]) -> None:
    out, report = _egress(stack, world, "undeclared-port")
    _assert_failed(report)
    assert not _pending(world["stray"]), "the undeclared port's listener got a connection"
    assert world["sink"].settled() == []
    assert not out.network_transcript


def test_c4_undeclared_name_does_not_resolve(stack: Stack, world: dict[str, Any]) -> None:
    out, report = _egress(stack, world, "undeclared-name")
    _assert_failed(report)
    assert report["resolve"]["error"] == "gaierror"
    assert world["sink"].settled() == []
    assert not out.network_transcript


def test_c4_undeclared_ip_is_refused_by_the_relay(stack: Stack, world: dict[str, Any]) -> None:
    port = world["sink"].port
    out, report = _egress(stack, world, "direct-ip", "failed")
    # The namespace's listener accepts; the relay then resets without a byte back.
    for r in report.values():
        assert r in ({"ok": True, "value": 0},) or not r["ok"], report
    assert world["sink"].settled() == [], "a refused connection reached the host server"
    assert not out.network_transcript
    messages = " ".join(_violations(out))
    assert f"undeclared destination 127.0.0.2:{port}" in messages, out.diagnostics
    assert f"undeclared destination 127.0.0.1:{port}" in messages, out.diagnostics


def test_c4_per_connection_byte_cap(stack: Stack, world: dict[str, Any]) -> None:
    out, _report = _egress(stack, world, "per-conn-cap", "failed")
    [got] = world["sink"].settled()
    assert 0 < len(got) <= PER_CONN_CAP
    [row] = out.network_transcript
    assert row.bytes_sent + row.bytes_received <= PER_CONN_CAP
    assert row.bytes_sent == len(got)
    assert any("max_bytes_per_connection" in m for m in _violations(out)), out.diagnostics


def test_c4_total_byte_cap_across_connections(stack: Stack, world: dict[str, Any]) -> None:
    out, report = _egress(stack, world, "total-cap", "failed")
    assert report["first"]["ok"], report
    got = world["sink"].settled()
    assert sum(len(g) for g in got) <= TOTAL_CAP
    assert got[0] == b"b" * 1000
    assert sum(r.bytes_sent + r.bytes_received for r in out.network_transcript) <= TOTAL_CAP
    assert any("max_bytes_total" in m for m in _violations(out)), out.diagnostics


# --- 3. process escapes from C1 ------------------------------------------------


def test_tiocsti_cannot_inject_input(stack: Stack) -> None:
    before = _stack_pids(stack)
    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        os.set_blocking(slave, False)
        name = os.ttyname(slave)
        os.chmod(name, 0o666)  # only the envelope stands between the action and this tty
        _out, report = _proc(stack, "tiocsti", name)
        for fd in ("fd0", "fd1", "fd2"):
            assert report[fd]["errno"] == errno.EPERM, report
        assert not report["dev_tty"]["ok"], report
        if report["host_pty_open"]["ok"]:
            assert all(r["errno"] == errno.EPERM for r in report["host_pty_inject"]), report
        with pytest.raises(BlockingIOError):
            os.read(slave, 64)  # nothing was pushed into the host terminal's input
    finally:
        os.close(master)
        os.close(slave)
    _assert_stack_intact(stack, before)


def test_only_the_standard_fds_are_inherited(stack: Stack) -> None:
    before = _stack_pids(stack)
    _out, report = _proc(stack, "fds")
    # 3 is the directory listdir itself opens (closed again before the readlinks).
    assert report["fds"] in ([0, 1, 2], [0, 1, 2, 3]), report
    targets = report["targets"]
    assert targets["0"] == "/dev/null", report
    assert targets["1"].startswith("pipe:") and targets["2"].startswith("pipe:"), report
    _assert_stack_intact(stack, before)


def test_connector_environment_is_out_of_reach(stack: Stack) -> None:
    connector = stack.pids()["connector"]
    assert connector is not None
    # The canary is real: the connector's own environment does carry SENSORIUM_ names.
    assert any(k.startswith("SENSORIUM_") for k in psutil.Process(connector).environ())
    _out, report = _proc(stack, "environ", str(connector))
    assert report["leaked"] == [], report
    assert len(report["pids"]) <= 3, report  # init and the program (and maybe its listdir)
    if connector not in report["pids"]:
        assert report["environ"][str(connector)] == errno.ENOENT, report


def test_signals_cannot_reach_the_stack(stack: Stack) -> None:
    before = _stack_pids(stack)
    targets = ",".join(str(p) for p in before.values())
    _out, report = _proc(stack, "kill", targets)
    for pid, r in report["targets"].items():
        assert r["error"] in ("ProcessLookupError", "PermissionError"), (pid, report)
    # Its own init is root's: not signalable by the action either.
    assert report["init"]["errno"] == errno.EPERM, report
    # kill(-1) found nothing it may signal but itself, which it spares.
    assert report["everyone"]["ok"] or report["everyone"]["errno"] == errno.ESRCH, report
    assert report["alive"] is True
    _assert_stack_intact(stack, before)


def test_io_uring_is_denied(stack: Stack) -> None:
    before = _stack_pids(stack)
    _out, report = _proc(stack, "io_uring")
    assert report["io_uring_setup"] == {"rc": -1, "errno": errno.EPERM}
    _assert_stack_intact(stack, before)


def test_ptrace_is_denied(stack: Stack) -> None:
    before = _stack_pids(stack)
    _out, report = _proc(stack, "ptrace")
    assert report["traceme"] == {"rc": -1, "errno": errno.EPERM}
    assert report["attach_init"] == {"rc": -1, "errno": errno.EPERM}
    _assert_stack_intact(stack, before)


def test_fork_bomb_is_capped_and_leaves_nothing(stack: Stack) -> None:
    before = _stack_pids(stack)
    marker = f"bomb-{uuid.uuid4().hex}"
    _out, report = _proc(stack, "forkbomb", marker)
    assert 0 < report["forks"] < MAX_PROCESSES, report
    assert report["stopped_by"] == errno.EAGAIN, report
    assert _none_marked(marker, 10.0) == [], "fork-bomb children outlived the action"
    # Nothing of the sandbox uid is left anywhere under this stack either.
    deadline = time.monotonic() + 10
    while (left := [p for p in stack.tree() if _uid(p) == SANDBOX_UID]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert left == []
    _assert_stack_intact(stack, before)


def _uid(p: psutil.Process) -> int | None:
    try:
        return int(p.uids().real)
    except psutil.Error:
        return None


def test_setsid_grandchild_dies_with_its_leader(stack: Stack) -> None:
    marker = f"setsid-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    out, report = _proc(stack, "setsid", marker)
    assert time.monotonic() - t0 < 5
    assert report["grandchild"] > 0
    assert out.exit_code == 0
    assert _none_marked(marker, 2.0) == [], "a setsid() grandchild outlived its action"


def test_setsid_grandchild_dies_when_the_leader_times_out(stack: Stack) -> None:
    marker = f"setsid-hold-{uuid.uuid4().hex}"
    out = _run(stack, "esc.proc", {"mode": "setsid-hold", "arg": marker}, timeout_ms=2000)
    assert out.status == "timed-out", (out.status, out.stderr.text)
    assert json.loads(out.stdout.text.splitlines()[0])["grandchild"] > 0
    assert _none_marked(marker, 2.0) == [], "a process of a timed-out action survived"


def test_stdout_flood_is_capped_and_the_connector_stays_small(stack: Stack) -> None:
    connector = psutil.Process(stack.pids()["connector"])
    out = _run(stack, "esc.proc", {"mode": "flood", "arg": "none"}, timeout_ms=10_000)
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert out.stdout.truncated
    assert out.stdout.bytes_total == 50 << 20
    assert out.stdout.bytes_captured <= STDOUT_CAP
    assert out.stderr.text == "flood done\n"
    assert connector.memory_info().rss < 300 << 20


def test_namespaces_and_mounts_are_denied(stack: Stack) -> None:
    before = _stack_pids(stack)
    _out, report = _proc(stack, "unshare")
    for call in ("newuser", "newns", "mount"):
        assert report[call] == {"rc": -1, "errno": errno.EPERM}, report
    _assert_stack_intact(stack, before)


def test_the_action_is_unprivileged(stack: Stack) -> None:
    _out, report = _proc(stack, "ids")
    assert report["uid"] == [SANDBOX_UID] * 3
    assert report["gid"] == [SANDBOX_UID] * 3
    assert report["groups"] == []
    assert report["caps"] == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapAmb": 0}
    assert report["no_new_privs"] == "1"
    assert report["seccomp"] == "2"
