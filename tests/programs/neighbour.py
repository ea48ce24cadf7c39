"""Two actions at once, each in its own sandbox: ``hold`` sets up things a neighbour
could reach (a UDP listener, a TCP one where Landlock allows it, a file in its /tmp,
a SysV shared-memory segment, signal handlers) and waits for the test's release
file; ``probe PID`` tries to reach each of them, and the holder's host pid, from the
second sandbox. Each prints a JSON report; the test asserts nothing got through,
from both sides."""

import ctypes
import json
import os
import signal
import socket
import sys
import time

PORT = 47123
MARKER = "/tmp/neighbour-marker"
SHM_KEY = 0x5E4B
IPC_CREAT = 0o1000
libc = ctypes.CDLL(None, use_errno=True)


def errno_of(fn):
    try:
        fn()
    except OSError as exc:
        return exc.errno or -1
    return 0


def hold(release):
    got = []
    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, lambda n, _f: got.append(n))
    tcp = socket.socket()
    # Landlock (ABI 4 on) refuses every TCP bind; where it does not, listen.
    tcp_bound = errno_of(lambda: tcp.bind(("0.0.0.0", PORT)))
    if tcp_bound == 0:
        tcp.listen()
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", PORT))
    udp.setblocking(False)
    shm = libc.shmget(SHM_KEY, 4096, IPC_CREAT | 0o666)
    with open(MARKER, "w") as f:  # last: the test waits for it
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 30
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    report = {"released": os.path.exists(release), "signals": got, "shm": shm >= 0}
    # EAGAIN: nobody came (EINVAL: not listening at all).
    report["accepted"] = tcp_bound == 0 and errno_of(tcp.accept) != 11
    report["datagram"] = errno_of(lambda: udp.recv(64)) != 11
    with open(MARKER) as f:
        report["marker"] = f.read() == str(os.getpid())
    print(json.dumps(report))


def probe(pid):
    report = {}
    own = os.getpid()
    seen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != own:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    seen.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                seen.append("?")
    report["others_in_proc"] = seen
    report["kill"] = errno_of(lambda: os.kill(pid, signal.SIGUSR1))
    report["kill_all"] = errno_of(lambda: os.kill(-1, signal.SIGUSR2))
    for host in ("127.0.0.1", "0.0.0.0"):

        def connect(host=host):
            with socket.create_connection((host, PORT), timeout=2):
                pass

        report[f"tcp {host}"] = errno_of(connect)

    def send():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", ("127.0.0.1", PORT))

    report["udp"] = errno_of(send)

    def abstract():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(b"\0neighbour")

    report["abstract unix"] = errno_of(abstract)
    report["marker"] = os.path.exists(MARKER)
    report["shm"] = libc.shmget(SHM_KEY, 0, 0)
    print(json.dumps(report))


if sys.argv[1] == "hold":
    hold(sys.argv[2])
else:
    probe(int(sys.argv[2]))
