"""CurveZMQ key files under ``<state>/keys/curve/`` (0700): who may talk to a tcp endpoint.

::

    server.key, server.key_secret         core's client-API server pair
    connector.key, connector.key_secret   the connector seam's server pair
    core.key, core.key_secret             the node's own client identity: core on the
                                          seam; the poller and the local CLI on core
    clients/NAME.key                      the allowlist: one public certificate per
                                          client, its grant (and the issuer
                                          module ids it may claim) in the
                                          certificate metadata
    issued/NAME.key_secret                a client secret made here, to hand over (0600)

Files are ZeroMQ certificates (ZPL, as ``zmq.auth`` and czmq write them), so
``zmq.auth.load_certificate`` reads them too. The client file is the one truth about
a client: present = allowlisted, its ``grants`` metadata = the actions it may invoke
(action ids, ``prefix.*`` patterns, groups; ``core/grants.py``), its ``modules``
metadata = the ``issuer.module_id`` values its directives may claim (none given: only
the client's own name; ``*``: any); revoking is deleting it.
Every write is a rename in place, so a server sees a change by its directory's mtime.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.utils.z85

from sensorium.shared.paths import StatePaths

# The node's own pairs, by role.
SERVER = "server"
CONNECTOR = "connector"
CORE = "core"
ROLES = (SERVER, CONNECTOR, CORE)
# Grants: "*" is every action; "a.*" every action id a.… and group a and a.anything;
# otherwise an action id or a group name (core/grants.py).
ALL_GROUPS = "*"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# Issuer module ids a key may claim: ``*`` (any), or a module id (045's registered ids
# are dotted, e.g. orbiplex.arca); no quotes, commas or spaces (certificate metadata).
MODULE_PATTERN = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9._:/-]{0,255})\Z")
ANY_MODULE = "*"
GROUP_PATTERN = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9._:/-]{0,126}(\.\*)?)\Z")
MAX_CERT_BYTES = 64 * 1024
_Z85_KEY = re.compile(r"^[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}\Z")
_LINE = re.compile(r'^(\s*)([A-Za-z0-9_-]+)\s*=\s*"([^"]*)"\s*$')


class CurveKeyError(ValueError):
    """A key file is missing, malformed or too open; the message names it."""


def fingerprint(public_key: str) -> str:
    """How logs and listings name a key without printing it: like an Ed25519 key/id."""
    try:
        raw = zmq.utils.z85.decode(public_key.encode())
    except (ValueError, TypeError):
        raw = public_key.encode()
    return "curve:" + hashlib.sha256(raw).hexdigest()[:16]


def valid_key(text: str) -> bool:
    return bool(_Z85_KEY.match(text))


@dataclass(frozen=True)
class Cert:
    public_key: str
    secret_key: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the secret half
        return f"<Cert {fingerprint(self.public_key)} secret={self.secret_key is not None}>"


def write_cert(path: Path, cert: Cert) -> None:
    """Atomically (write beside, fsync, rename); a secret certificate is 0600 from birth."""
    lines = [
        "#   ZeroMQ CURVE " + ("**Secret** " if cert.secret_key else "Public ") + "Certificate"
    ]
    if cert.secret_key:
        lines.append("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
    lines += ["", "metadata"]
    for key, value in cert.metadata.items():
        if '"' in value or "\n" in value:
            raise CurveKeyError(f"metadata {key} may not hold quotes or newlines")
        lines.append(f'    {key} = "{value}"')
    lines += ["curve", f'    public-key = "{cert.public_key}"']
    if cert.secret_key:
        lines.append(f'    secret-key = "{cert.secret_key}"')
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        if cert.secret_key is None:
            os.fchmod(fd, 0o644)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_cert(path: Path, *, secret: bool = False) -> Cert:
    """A certificate; with ``secret``, it must hold the secret key and be private (0600)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CurveKeyError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CurveKeyError(f"{path} is not a regular file")
        if secret and st.st_mode & 0o077:
            raise CurveKeyError(f"{path} is mode {st.st_mode & 0o777:o}; a secret key must be 0600")
        data = os.read(fd, MAX_CERT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CERT_BYTES:
        raise CurveKeyError(f"{path} is over {MAX_CERT_BYTES} bytes")
    section = ""
    keys: dict[str, str] = {}
    meta: dict[str, str] = {}
    for raw in data.decode("utf-8", "replace").splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if not raw[0].isspace():
            section = raw.strip()
            continue
        m = _LINE.match(raw)
        if m is None:
            raise CurveKeyError(f"{path}: cannot read line {raw.strip()[:60]!r}")
        if section == "curve":
            keys[m[2]] = m[3]
        elif section == "metadata":
            meta[m[2]] = m[3]
    public, secret_key = keys.get("public-key", ""), keys.get("secret-key")
    if not valid_key(public):
        raise CurveKeyError(f"{path} has no valid public-key (40 Z85 characters)")
    if secret and (secret_key is None or not valid_key(secret_key)):
        raise CurveKeyError(f"{path} has no valid secret-key")
    return Cert(public, secret_key if secret else None, meta)


def new_pair() -> tuple[str, str]:
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


@dataclass(frozen=True)
class ClientEntry:
    """An allowlisted client key, the actions it may invoke (``grants``) and the issuer module
    ids it was bound to (``modules``; empty: none named, see :attr:`claims`)."""

    name: str
    public_key: str
    grants: tuple[str, ...]
    modules: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    @property
    def claims(self) -> tuple[str, ...]:
        """The ``issuer.module_id`` values this key may send. A key bound to no module
        may claim only its own name: the operator named it, so that claim is theirs;
        any other module id would be the key's word alone."""
        return self.modules or (self.name,)

    def may_claim(self, module_id: str) -> bool:
        return ANY_MODULE in self.claims or module_id in self.claims


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise CurveKeyError(
            f"client name {name[:80]!r} must be 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)"
        )
    return name


def check_groups(groups: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    for g in groups:
        if not GROUP_PATTERN.match(g):
            raise CurveKeyError(
                f"grant {g[:80]!r} is not an action id, a group name, a 'prefix.*' or '*' "
                "(every action)"
            )
    return tuple(dict.fromkeys(groups))


def check_modules(modules: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    for m in modules:
        if not MODULE_PATTERN.match(m):
            raise CurveKeyError(
                f"module {m[:80]!r} is not a module id (e.g. orbiplex.arca) or '*' (any)"
            )
    return tuple(dict.fromkeys(modules))


def parse_grants(text: str) -> tuple[str, ...]:
    return tuple(g for g in (p.strip() for p in text.split(",")) if g)


class CurveStore:
    """The key files of one state directory."""

    def __init__(self, paths: StatePaths) -> None:
        self.root = paths.keys / "curve"
        self.clients_dir = self.root / "clients"
        self.issued_dir = self.root / "issued"

    def __repr__(self) -> str:
        return f"<CurveStore {self.root}>"

    def _private_dirs(self) -> None:
        for d in (self.root.parent, self.root, self.clients_dir, self.issued_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)

    def public_path(self, role: str) -> Path:
        return self.root / f"{role}.key"

    def secret_path(self, role: str) -> Path:
        return self.root / f"{role}.key_secret"

    def init(self) -> dict[str, tuple[str, bool]]:
        """Make each missing node pair; an existing one is kept. Role -> (public, made)."""
        self._private_dirs()
        out: dict[str, tuple[str, bool]] = {}
        for role in ROLES:
            if self.secret_path(role).exists():
                cert = read_cert(self.secret_path(role), secret=True)
                if not self.public_path(role).exists():
                    write_cert(self.public_path(role), Cert(cert.public_key, None, {"role": role}))
                out[role] = (cert.public_key, False)
                continue
            public, secret = new_pair()
            write_cert(self.secret_path(role), Cert(public, secret, {"role": role}))
            write_cert(self.public_path(role), Cert(public, None, {"role": role}))
            out[role] = (public, True)
        return out

    def pair(self, role: str) -> Cert:
        """A node pair with its secret (FileNotFoundError when not made yet)."""
        return read_cert(self.secret_path(role), secret=True)

    def public(self, role: str) -> str:
        return read_cert(self.public_path(role)).public_key

    def has(self, *roles: str) -> bool:
        return all(self.secret_path(r).exists() for r in roles)

    # -- clients ------------------------------------------------------------

    def client_path(self, name: str) -> Path:
        return self.clients_dir / f"{check_name(name)}.key"

    def add_client(
        self,
        name: str,
        grants: list[str],
        public_key: str | None = None,
        modules: list[str] | None = None,
    ) -> tuple[ClientEntry, Path | None]:
        """Allowlist a client. Without ``public_key`` a pair is made here and its secret
        (with the server's public key, so it is all a client needs) goes to ``issued/``.
        ``modules``: the issuer module ids it may claim (none: its own name only)."""
        path = self.client_path(name)
        groups = check_groups(grants)
        bound = check_modules(modules or [])
        if path.exists():
            raise CurveKeyError(f"client {name} exists ({path}); revoke it first")
        self._private_dirs()
        issued: Path | None = None
        if public_key is None:
            public_key, secret = new_pair()
            issued = self.issued_dir / f"{name}.key_secret"
            meta = {"name": name}
            if self.public_path(SERVER).exists():
                meta["server-public-key"] = self.public(SERVER)
            write_cert(issued, Cert(public_key, secret, meta))
        elif not valid_key(public_key):
            raise CurveKeyError("--public-key must be a Z85 CURVE public key (40 characters)")
        entry = ClientEntry(name, public_key, groups, bound)
        self._write_client(entry)
        return entry, issued

    def _write_client(self, entry: ClientEntry) -> None:
        meta = {"name": entry.name, "grants": ",".join(entry.grants)}
        if entry.modules:
            meta["modules"] = ",".join(entry.modules)
        write_cert(self.client_path(entry.name), Cert(entry.public_key, None, meta))

    def client(self, name: str) -> ClientEntry:
        path = self.client_path(name)
        try:
            cert = read_cert(path)
        except FileNotFoundError:
            raise CurveKeyError(f"no client {name} (no {path})") from None
        return _entry(name, cert)

    def set_grants(self, name: str, grants: list[str] | tuple[str, ...]) -> ClientEntry:
        entry = self.client(name)
        updated = ClientEntry(name, entry.public_key, check_groups(grants), entry.modules)
        self._write_client(updated)
        return updated

    def set_modules(self, name: str, modules: list[str] | tuple[str, ...]) -> ClientEntry:
        """Bind a client to the issuer module ids it may claim (empty: its name only)."""
        entry = self.client(name)
        updated = ClientEntry(name, entry.public_key, entry.grants, check_modules(modules))
        self._write_client(updated)
        return updated

    def revoke(self, name: str) -> bool:
        """Drop a client from the allowlist (and any secret issued for it)."""
        path = self.client_path(name)
        (self.issued_dir / f"{name}.key_secret").unlink(missing_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def clients(self) -> tuple[list[ClientEntry], list[str]]:
        """Every readable client file, and a problem line for each unreadable one."""
        entries: list[ClientEntry] = []
        problems: list[str] = []
        if not self.clients_dir.is_dir():
            return entries, problems
        for path in sorted(self.clients_dir.glob("*.key")):
            if not NAME_PATTERN.match(path.stem):
                problems.append(f"{path}: not a client name")
                continue
            try:
                cert = read_cert(path)
            except (OSError, CurveKeyError) as exc:
                problems.append(str(exc))
                continue
            entries.append(_entry(path.stem, cert))
        return entries, problems


def _entry(name: str, cert: Cert) -> ClientEntry:
    meta = cert.metadata
    grants, modules = parse_grants(meta.get("grants", "")), parse_grants(meta.get("modules", ""))
    return ClientEntry(name, cert.public_key, grants, modules)
