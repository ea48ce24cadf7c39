"""The scoped signer grant end to end (seed 048's ``signing`` block; issue 18 item 1).

An action declared with ``signing`` gets one bounded grant per directive: its script
calls ``sensorium-sign`` (here ``python -m sensorium.shared.signer.helper``, the same
code) and gets one domain-separated signature under ``git.commit.v1``. A second one
(max 1), another domain, a forged token, another directive's token, and a replay
after the directive ended are refused and audited; the key never reaches the sandbox;
``sensorium verify-signature`` checks the signature given. An action flooding its
channel with bad lines buys a bounded number of audit rows: the channel is closed.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from harness import ACTION_PYTHON, NODE_UID, running_stack

import sensorium
from sensorium.core.signer.server import MAX_REFUSALS
from sensorium.shared.keys import NODE_KEY
from sensorium.shared.paths import StatePaths

DOMAIN = "git.commit.v1"
PAYLOAD = "tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor a <a@b> 0 +0000\n\nmsg\n"

SCRIPT = """\
import json, os, subprocess, sys
params = json.loads(sys.argv[sys.argv.index('--params-json') + 1])
fd = int(os.environ.get('SENSORIUM_SIGNER_FD', '-1'))

def sign(domain, payload, token=None):
    env = dict(os.environ)
    if token is not None:
        env['SENSORIUM_SIGNER_TOKEN'] = token
    r = subprocess.run(
        [sys.executable, '-m', 'sensorium.shared.signer.helper', '--domain', domain],
        input=payload.encode(), capture_output=True, env=env,
        pass_fds=(fd,) if fd >= 0 else ())
    return {'rc': r.returncode, 'out': r.stdout.decode(), 'err': r.stderr.decode()}

report = {'token': os.environ.get('SENSORIUM_SIGNER_TOKEN'), 'fd': fd}
report['steps'] = [sign(s['domain'], s['payload'], s.get('token')) for s in params['steps']]
if params.get('flood') and fd >= 0:
    # Straight at the channel: bad lines until the signer closes it.
    import socket
    s = socket.socket(fileno=os.dup(fd))
    line = json.dumps({'token': 'forged' + 'A' * 40, 'domain': 'x', 'payload/sha256': 'y'})
    try:
        s.sendall((line + '\\n').encode() * params['flood'])
    except OSError as exc:
        report['flood_send'] = exc.errno
    got = b''
    try:
        while chunk := s.recv(65536):
            got += chunk
    except OSError as exc:
        report['flood_recv'] = exc.errno
    report['flood_replies'] = got.count(b'\\n')
# All the action can see of itself and of the node: its environment, its fds, and
# whatever it can read where the node keeps its keys.
with open('/proc/self/environ', 'rb') as f:
    report['environ'] = f.read().decode(errors='replace')
fds = {}
for n in os.listdir('/proc/self/fd'):
    try:
        fds[n] = os.readlink(f'/proc/self/fd/{n}')
    except OSError:
        pass
report['fds'] = fds
seen = {}
for probe in params['probe']:
    paths = [probe]
    for d, _dirs, files in os.walk(probe):
        paths += [os.path.join(d, f) for f in files]
    for p in paths:
        try:
            with open(p, 'rb') as f:
                seen[p] = f.read(65536).hex()
        except OSError as exc:
            seen[p] = f'unreadable: errno {exc.errno}'
report['seen'] = seen
print(json.dumps(report))
"""


def _helper_lib(dest: Path) -> None:
    """The helper's own modules (standard library only), where any uid can read them."""
    src = Path(sensorium.__file__).parent
    for rel in (
        "__init__.py",
        "shared/__init__.py",
        "shared/signer/__init__.py",
        "shared/signer/protocol.py",
        "shared/signer/helper.py",
    ):
        target = dest / "sensorium" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, target)
    for d, _dirs, files in os.walk(dest):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


@pytest.fixture(scope="module")
def scripts() -> Iterator[Path]:
    # World-readable and not under /tmp (every action sees its own empty /tmp).
    d = Path(tempfile.mkdtemp(prefix="sensorium-sign-", dir="/var/tmp"))
    (d / "sign.py").write_text(SCRIPT)
    _helper_lib(d / "lib")
    os.chmod(d, 0o755)
    (d / "sign.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _action(scripts: Path, **extra: Any) -> dict[str, Any]:
    script = str(scripts / "sign.py")
    decl: dict[str, Any] = {
        "action_id": "test.sign.commit",
        "class": "allowlisted-script",
        "group": "test",
        "executable": {
            "kind": "script",
            "path": script,
            "interpreter": ACTION_PYTHON,
            "argv_shape": ["python3", script, "--params-json", "{{params_json}}"],
        },
        "script": {"allowed_roots": [str(scripts)]},
        "environment": {"set": {"PYTHONPATH": str(scripts / "lib")}},
        "parameters_schema": {
            "type": "object",
            "properties": {
                "steps": {"type": "array", "items": {"type": "object"}},
                "probe": {"type": "array", "items": {"type": "string"}},
                "flood": {"type": "integer"},
            },
            "required": ["steps", "probe"],
            "additionalProperties": False,
        },
        "limits": {"stdout_max_bytes": 1048576},
        "signing": {
            "allowed_domains": [DOMAIN],
            "key_ref": {"kind": "primary-participant"},
            "max_signatures": 1,
        },
    }
    decl.update(extra)
    return decl


def _events(paths: StatePaths) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{paths.audit_db}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM signer_events ORDER BY at")]
    finally:
        conn.close()


def _ask(paths: StatePaths, token: str) -> dict[str, Any]:
    """A request straight to core's signer socket, as a process holding a stolen token."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(paths.run / "signer.sock"))
        line = {"token": token, "domain": DOMAIN, "payload/sha256": "0" * 64}
        s.sendall(json.dumps(line).encode() + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(4096)
            assert chunk, "the signer closed the channel without an answer"
            buf += chunk
    reply: dict[str, Any] = json.loads(buf.split(b"\n")[0])
    return reply


def _code(step: dict[str, Any]) -> str:
    assert step["rc"] != 0, step
    return step["err"].split(":")[1].strip()


def _key_forms(paths: StatePaths) -> list[str]:
    seed = (paths.keys / NODE_KEY).read_bytes()
    b64 = base64.urlsafe_b64encode(seed).rstrip(b"=").decode()
    std = base64.b64encode(seed).decode().rstrip("=")
    return [seed.hex(), b64, std, seed.decode("latin-1")]


def _run_signer_checks(stack: Any, scripts: Path) -> None:
    paths: StatePaths = stack.paths
    probe = [str(paths.root), str(paths.keys), str(paths.keys / NODE_KEY)]
    steps = [
        {"domain": DOMAIN, "payload": PAYLOAD},
        {"domain": "git.tag.v1", "payload": PAYLOAD},  # another domain
        {"domain": DOMAIN, "payload": PAYLOAD + "x"},  # a second signature: max 1
        {"domain": DOMAIN, "payload": PAYLOAD, "token": "forged" + "A" * 40},
    ]
    with stack.client() as client:
        out = client.invoke("test.sign.commit", {"steps": steps, "probe": probe})
        assert out.status == "completed", out
        report = json.loads(out.stdout.text)
        first, other_domain, second, forged = report["steps"]
        assert first["rc"] == 0, first
        signed = json.loads(first["out"])
        assert signed["domain"] == DOMAIN
        assert _code(other_domain) == "signer-domain-refused"
        assert _code(second) == "signer-count-exhausted"
        assert _code(forged) == "signer-grant-unknown"

        # The outcome records the signature given: domain, payload digest, key id; never
        # the payload.
        assert not isinstance(out.signatures, msgspec.UnsetType)
        assert [(s.domain, s.payload_sha256, s.key_id) for s in out.signatures] == [
            (DOMAIN, signed["payload/sha256"], signed["key/id"])
        ]
        assert PAYLOAD.splitlines()[0] not in json.dumps(msgspec.to_builtins(out.signatures))

        # And so does its audit record.
        record = client.audit_get(out.outcome_id)
        assert not isinstance(record.signatures, msgspec.UnsetType)
        assert [s.signature for s in record.signatures] == [signed["signature"]]

        # The key never appears in the sandbox: not in its environment, its fds, or
        # anything it could read where the node keeps it.
        seen = out.stdout.text
        for form in _key_forms(paths):
            assert form not in seen
        for p, body in report["seen"].items():
            assert body.startswith("unreadable") or not body, (p, body[:80])

        # Another directive presenting the first one's token (its directive has ended).
        stolen = [{"domain": DOMAIN, "payload": PAYLOAD, "token": report["token"]}]
        again = client.invoke("test.sign.commit", {"steps": stolen, "probe": []})
        assert again.status == "completed", again
        (replayed,) = json.loads(again.stdout.text)["steps"]
        assert _code(replayed) == "signer-grant-ended"
        assert list(again.signatures) == []

        # An action sending a thousand bad lines: a few refusals, then its channel closed.
        flood = client.invoke("test.sign.commit", {"steps": [], "probe": [], "flood": 1000})
        assert flood.status == "completed", flood
        flooded = json.loads(flood.stdout.text)
        assert flooded["flood_replies"] <= MAX_REFUSALS, flooded
        assert list(flood.signatures) == []

    # A replay after the directive ended, and a forged token, straight at the socket.
    assert _ask(paths, report["token"])["code"] == "signer-grant-ended"
    assert _ask(paths, "A" * 43)["code"] == "signer-grant-unknown"

    # sensorium verify-signature checks the signature given, and nothing else.
    work = Path(tempfile.mkdtemp(prefix="sig-"))
    try:
        (work / "sig.json").write_text(first["out"])
        (work / "payload").write_text(PAYLOAD)
        (work / "other").write_text(PAYLOAD + "tampered")
        ok = stack.cli(
            "verify-signature",
            "--signed",
            str(work / "sig.json"),
            "--payload",
            str(work / "payload"),
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        bad = stack.cli(
            "verify-signature", "--signed", str(work / "sig.json"), "--payload", str(work / "other")
        )
        assert bad.returncode == 1 and "signature-invalid" in bad.stderr, bad.stderr
        wrong = stack.cli(
            "verify-signature", "--signed", str(work / "sig.json"), "--domain", "git.tag.v1"
        )
        assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)

    # Every grant, signature and refusal is in the audit.
    events = _events(paths)
    refused = sorted(e["code"] for e in events if e["kind"] == "refused")
    assert refused == sorted(
        [
            "signer-domain-refused",
            "signer-count-exhausted",
            "signer-grant-unknown",
            "signer-grant-ended",
            "signer-grant-ended",
            "signer-grant-unknown",
        ]
        + ["signer-grant-unknown"] * MAX_REFUSALS  # the flood's, then its channel closed
    ), events
    kinds = [e["kind"] for e in events]
    assert kinds.count("signed") == 1
    assert kinds.count("issued") == kinds.count("ended") == 3
    assert kinds.count("closed") == 1
    assert all(e["payload_sha256"] != PAYLOAD for e in events)


def test_one_signature_under_its_grant_and_every_other_request_refused(scripts: Path) -> None:
    with running_stack([_action(scripts)]) as stack:
        _run_signer_checks(stack, scripts)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a node as another uid needs root")
def test_the_grant_holds_on_a_node_run_by_an_ordinary_user(scripts: Path) -> None:
    with running_stack([_action(scripts)], user=NODE_UID) as stack:
        _run_signer_checks(stack, scripts)
