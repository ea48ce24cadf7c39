"""Each action class end to end through core, the connector and a real kernel sandbox."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import (
    ACTION_PYTHON,
    NODE_UID,
    PROGRAMS,
    Stack,
    python_action,
    running_stack,
    start_stack,
)

# Run as root, the suite also starts the node as an ordinary uid; each test runs on both.
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="starting a node as root and as another uid needs root"
)
SANDBOX_UID = 65534


@pytest.fixture(scope="module", params=["root", "user"])
def node_user(request: pytest.FixtureRequest) -> int | None:
    """The uid the whole node runs as: root (None), or an ordinary user."""
    return None if request.param == "root" else NODE_UID


@pytest.fixture(scope="module")
def action_uid(node_user: int | None) -> int:
    """A root node drops actions to the sandbox uid; a user's actions keep the user's."""
    return SANDBOX_UID if node_user is None else node_user


NOBODY_PARAMS: dict[str, Any] = {"type": "object", "additionalProperties": False}


def _shared_dir(prefix: str, owner: int | None = None) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    d.chmod(0o755)
    if owner is not None:
        os.chown(d, owner, owner)
    return d


def _code_action(action_id: str, code: str, **extra: Any) -> dict[str, Any]:
    """A declaration running a few lines of Python written to a world-readable file."""
    path = PROGRAMS / f"{action_id.replace('.', '_')}.py"
    path.write_text(code)
    path.chmod(0o755)
    decl = python_action(action_id, path.name, **extra)
    decl["parameters_schema"] = NOBODY_PARAMS
    return decl


class Echo:
    """A TCP server on host loopback that answers every line with its upper-case copy
    (and, with ``reset``, then ends the connection with a RST instead of a FIN)."""

    def __init__(self, reset: bool = False, host: str = "127.0.0.1") -> None:
        self.reset = reset
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, 0), family=family)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(65536)
                conn.sendall(data.upper())
                if self.reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self.sock.close()


class UdpEcho:
    """A UDP server on host loopback that answers every datagram with its upper-case copy."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(65536)
                self.sock.sendto(data.upper(), peer)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


# The program's side of a UDP exchange: one reply awaited, the datagram resent at most
# ``tries`` times (loss on loopback is not expected; an ICMP refusal ends a try early).
UDP_ASK = """import json, socket
def ask(port, tries):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    for _ in range(tries):
        s.sendto(b'ping', ('127.0.0.1', port))
        try:
            return s.recv(100).decode()
        except OSError:
            pass
    return None
"""


@pytest.fixture(scope="module")
def world(action_uid: int) -> Iterator[dict[str, Any]]:
    scripts = _shared_dir("sensorium-scripts-")
    (scripts / "refine.py").write_text(
        "import json, sys\n"
        "params = json.loads(sys.argv[sys.argv.index('--params-json') + 1])\n"
        "print(json.dumps({'words': len(params['text'].split()), 'argv0': sys.argv[0]}))\n"
    )
    write_root = _shared_dir("sensorium-wr-", owner=action_uid)
    # The write root is the action's uid's to write (and the node's, to commit).
    for name, text in (("keep.txt", "old\n"), ("gone.txt", "bye\n")):
        (write_root / name).write_text(text)
        os.chown(write_root / name, action_uid, action_uid)
    echo, rst, echo6, udp = Echo(), Echo(reset=True), Echo(host="::1"), UdpEcho()
    try:
        yield {
            "scripts": scripts,
            "write_root": write_root,
            "echo": echo,
            "rst": rst,
            "echo6": echo6,
            "udp": udp,
        }
    finally:
        for server in (echo, rst, echo6, udp):
            server.close()
        shutil.rmtree(scripts, ignore_errors=True)
        shutil.rmtree(write_root, ignore_errors=True)


@pytest.fixture(scope="module")
def classes(world: dict[str, Any], node_user: int | None) -> Iterator[Stack]:
    script = str(world["scripts"] / "refine.py")
    actions = [
        _code_action(
            "cls.whoami",
            "import os, json\n"
            "print(json.dumps({'uid': os.getuid(), 'pid': os.getpid(), 'cwd': os.getcwd()}))\n",
            result_contract={"stdout_format": "json"},
        ),
        {
            "action_id": "cls.script",
            "class": "allowlisted-script",
            "executable": {
                "kind": "script",
                "path": script,
                "interpreter": ACTION_PYTHON,
                "argv_shape": ["python3", script, "--params-json", "{{params_json}}"],
                "sha256": hashlib.sha256((world["scripts"] / "refine.py").read_bytes()).hexdigest(),
            },
            "script": {"allowed_roots": [str(world["scripts"])]},
            "parameters_schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
            "result_contract": {"stdout_format": "json"},
        },
        {
            **_code_action(
                "cls.write",
                "import os\n"
                "open('keep.txt', 'w').write('new\\n')\n"
                "os.unlink('gone.txt')\n"
                "os.makedirs('out', exist_ok=True)\n"
                "open('out/made.txt', 'w').write('made\\n')\n",
            ),
            "class": "scoped-fs-write",
            "fs_write": {
                "write_root": str(world["write_root"]),
                "max_bytes_total": 1 << 20,
                "max_bytes_per_file": 1 << 16,
            },
        },
        {
            **_code_action(
                "cls.fetch",
                "import socket, sys\n"
                f"s = socket.create_connection(('localhost', {world['echo'].port}), timeout=5)\n"
                "s.sendall(b'ping')\n"
                "print(s.recv(100).decode())\n",
            ),
            "class": "egress-network-spawn",
            "egress_network": {
                "endpoints": [{"host": "localhost", "port": world["echo"].port, "protocol": "tcp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            },
        },
        {
            **_code_action(
                "cls.fetch-rst",
                "import socket, sys\n"
                f"s = socket.create_connection(('localhost', {world['rst'].port}), timeout=5)\n"
                "s.sendall(b'ping')\n"
                "print(s.recv(100).decode())\n",
            ),
            "class": "egress-network-spawn",
            "egress_network": {
                "endpoints": [{"host": "localhost", "port": world["rst"].port, "protocol": "tcp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            },
        },
        {
            **_code_action(
                "cls.fetch-v6",
                f"import socket\ns = socket.create_connection(('::1', {world['echo6'].port}))\n"
                "s.sendall(b'ping')\n"
                "print(s.recv(100).decode())\n",
            ),
            "class": "egress-network-spawn",
            "egress_network": {
                "endpoints": [{"host": "::1", "port": world["echo6"].port, "protocol": "tcp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            },
        },
        {
            **_code_action(
                "cls.udp",
                UDP_ASK + f"print(json.dumps([ask({world['udp'].port}, 5), ask(9, 2)]))\n",
                result_contract={"stdout_format": "json"},
            ),
            "class": "egress-network-spawn",
            "egress_network": {
                "endpoints": [{"host": "127.0.0.1", "port": world["udp"].port, "protocol": "udp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            },
        },
        {
            **_code_action(
                "cls.udp-capped",
                UDP_ASK + f"print(json.dumps(ask({world['udp'].port}, 2)))\n",
                result_contract={"stdout_format": "json"},
            ),
            "class": "egress-network-spawn",
            "egress_network": {
                "endpoints": [{"host": "127.0.0.1", "port": world["udp"].port, "protocol": "udp"}],
                "max_bytes_total": 4096,
                # 'ping' out fits (4 bytes + an 8-byte header), 'PING' back would cross it.
                "max_bytes_per_connection": 20,
            },
        },
        {
            **_code_action(
                "cls.produce",
                "open('/tmp/artifacts/report.txt', 'w').write('a report\\n')\n",
            ),
            "class": "artifact-producing-spawn",
            "artifact": {
                "max_count": 4,
                "max_bytes_per": 1024,
                "max_bytes_total": 4096,
                "allowed_media_types": ["text/plain"],
            },
        },
    ]
    actions += _peeks(world)
    for a in actions:
        if a["action_id"] != "cls.script":
            a["executable"]["argv_shape"][1] = str(
                PROGRAMS / f"{a['action_id'].replace('.', '_')}.py"
            )
    with running_stack(actions, user=node_user) as s:
        yield s


# Tries every way a program reads a path: open, list, stat, connect (a socket).
PEEK = """import json, os, socket, sys
seen = {}
for path in sys.argv[1:]:
    got = []
    try:
        got.append(("read", len(open(path, "rb").read())))
    except OSError as exc:
        pass
    try:
        got.append(("list", sorted(os.listdir(path))))
    except OSError:
        pass
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        got.append(("connect", True))
    except OSError:
        pass
    if os.path.exists(path):
        got.append(("exists", True))
    seen[path] = got
print(json.dumps(seen))
"""


def _peeks(world: dict[str, Any]) -> list[dict[str, Any]]:
    """One peeking action per class that has an envelope of its own."""
    blocks: dict[str, dict[str, Any]] = {
        "read-only-spawn": {},
        "scoped-fs-write": {
            "fs_write": {
                "write_root": str(world["write_root"]),
                "max_bytes_total": 4096,
                "max_bytes_per_file": 4096,
            }
        },
        "egress-network-spawn": {
            "egress_network": {
                "endpoints": [{"host": "localhost", "port": world["echo"].port, "protocol": "tcp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            }
        },
        "artifact-producing-spawn": {
            "artifact": {
                "max_count": 1,
                "max_bytes_per": 16,
                "max_bytes_total": 16,
                "allowed_media_types": ["text/plain"],
            }
        },
    }
    out = []
    for cls, block in blocks.items():
        decl = _code_action(f"cls.peek-{cls.split('-')[0]}", PEEK, **block)
        decl["class"] = cls
        decl["executable"]["argv_shape"] += ["{{path}}"]
        decl["parameters_schema"] = {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        }
        decl["result_contract"] = {"stdout_format": "json"}
        out.append(decl)
    return out


def test_c1_runs_unprivileged_as_pid_in_its_own_namespace(classes: Stack, action_uid: int) -> None:
    with classes.client() as c:
        out = c.invoke("cls.whoami", {})
    assert out.status == "completed", out.stderr.text
    assert out.result is not None
    assert out.result.json == {"uid": action_uid, "pid": 2, "cwd": "/tmp"}


@pytest.mark.parametrize("peek", ["read", "scoped", "egress", "artifact"])
def test_no_action_of_any_class_reaches_the_node_s_state(classes: Stack, peek: str) -> None:
    """Keys, sockets, logs and databases of the node, and the home of its user: none of
    it exists for an action, whichever uid the node runs as (a masked directory may
    show as an empty, unreadable one; nothing beneath it exists)."""
    paths = classes.paths
    targets = [
        paths.root,
        paths.root / "keys",
        *sorted(str(p) for p in (paths.root / "keys").iterdir()),
        paths.run / "core.sock",
        paths.root / "logs" / "connector.jsonl",
        paths.root / "storage" / "audit.sqlite",
        paths.root.parent / "home",
    ]
    with classes.client() as c:
        for target in targets:
            out = c.invoke(f"cls.peek-{peek}", {"path": str(target)})
            assert out.status == "completed", (out.stderr.text, out.diagnostics)
            assert out.result is not None
            masked = str(target) in (str(paths.root), str(paths.root.parent / "home"))
            allowed = ([], [["exists", True]]) if masked else ([],)
            assert out.result.json[str(target)] in allowed, out.result.json


def test_c2_runs_the_sealed_script_with_canonical_params(classes: Stack) -> None:
    with classes.client() as c:
        out = c.invoke("cls.script", {"text": "three small words"})
    assert out.status == "completed", out.stderr.text
    assert out.result is not None
    assert out.result.json == {"words": 3, "argv0": "/dev/fd/3"}


def test_c3_commits_writes_and_lists_them(classes: Stack, world: dict[str, Any]) -> None:
    root: Path = world["write_root"]
    with classes.client() as c:
        out = c.invoke("cls.write", {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert (root / "keep.txt").read_text() == "new\n"
    assert not (root / "gone.txt").exists()
    assert (root / "out" / "made.txt").read_text() == "made\n"
    touched = {f.path: f for f in out.files_touched}
    assert touched["gone.txt"].deleted
    assert touched["keep.txt"].sha256 == hashlib.sha256(b"new\n").hexdigest()
    assert touched["out/made.txt"].bytes == 5


def test_c4_reaches_the_declared_endpoint_through_the_relay(
    classes: Stack, world: dict[str, Any]
) -> None:
    with classes.client() as c:
        out = c.invoke("cls.fetch", {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert out.stdout.text.strip() == "PING"
    [row] = out.network_transcript
    assert (row.host, row.port, row.protocol) == ("localhost", world["echo"].port, "tcp")
    assert (row.bytes_sent, row.bytes_received) == (4, 4)


def test_c4_a_server_that_resets_after_answering_is_no_violation(classes: Stack) -> None:
    """A RST from the far end is the network's doing, not the action's."""
    with classes.client() as c:
        out = c.invoke("cls.fetch-rst", {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert out.stdout.text.strip() == "PING"


def test_c4_reaches_a_declared_ipv6_endpoint(classes: Stack, world: dict[str, Any]) -> None:
    with classes.client() as c:
        out = c.invoke("cls.fetch-v6", {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert out.stdout.text.strip() == "PING"
    [row] = out.network_transcript
    assert (row.host, row.port, row.protocol) == ("::1", world["echo6"].port, "tcp")
    assert (row.bytes_sent, row.bytes_received) == (4, 4)


def test_c4_relays_declared_udp_and_nothing_else(classes: Stack, world: dict[str, Any]) -> None:
    with classes.client() as c:
        out = c.invoke("cls.udp", {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    # The declared endpoint answers; an undeclared port gets nothing at all.
    assert json.loads(out.stdout.text) == ["PING", None]
    [row] = out.network_transcript
    assert (row.host, row.port, row.protocol) == ("127.0.0.1", world["udp"].port, "udp")
    assert row.bytes_received == 4 and row.bytes_sent in (4, 8, 12, 16, 20)


def test_c4_cuts_a_udp_flow_at_its_byte_cap(classes: Stack, world: dict[str, Any]) -> None:
    with classes.client() as c:
        out = c.invoke("cls.udp-capped", {})
    assert json.loads(out.stdout.text) is None, (out.stderr.text, out.diagnostics)
    [row] = out.network_transcript
    assert (row.protocol, row.bytes_sent, row.bytes_received) == ("udp", 4, 0)
    violations = [d.message for d in out.diagnostics if d.code == "envelope-violation"]
    assert any("capped: max_bytes_per_connection (20) reached" in m for m in violations), (
        out.diagnostics
    )


def test_c5_promotes_artifacts_into_the_lane(classes: Stack) -> None:
    with classes.client() as c:
        out = c.invoke("cls.produce", {})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    [ref] = out.artifact_refs
    digest = hashlib.sha256(b"a report\n").hexdigest()
    assert ref.id == f"sha256:{digest}"
    assert ref.media_type == "text/plain"
    assert ref.size == 9
    lane = classes.paths.artifacts / digest[:2] / digest
    assert lane.read_bytes() == b"a report\n"


def test_the_ledger_shows_every_class_enabled(classes: Stack) -> None:
    res = classes.cli("actions", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows = doc["actions"] if isinstance(doc, dict) else doc
    states = {a["action_id"]: a["state"] for a in rows}
    assert all(states[a] == "enabled" for a in states if a.startswith("cls.")), states


def test_a_restart_on_the_same_state_dir_serves_every_class_again(
    classes: Stack, node_user: int | None, world: dict[str, Any]
) -> None:
    """The envelope directories a stopped node leaves are reusable by its next start,
    whoever it runs as (an ordinary user cannot rewrite a read-only file of its own)."""
    classes.stop()
    gone = world["write_root"] / "gone.txt"  # what cls.write deletes, back again
    gone.write_text("bye\n")
    os.chown(gone, *(2 * [SANDBOX_UID if node_user is None else node_user]))
    again = start_stack(classes.paths, user=node_user)
    try:
        again.wait_ready()
        with again.client() as c:
            for aid in ("cls.whoami", "cls.write", "cls.fetch", "cls.produce"):
                out = c.invoke(aid, {})
                assert out.status == "completed", (aid, out.stderr.text, out.diagnostics)
    finally:
        again.stop()
