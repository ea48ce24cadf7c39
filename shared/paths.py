"""The state directory: where each piece of durable state and each socket lives."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

STATE_DIR_ENV = "SENSORIUM_STATE_DIR"
# AF_UNIX sun_path is 108 bytes including the NUL; ZeroMQ ipc endpoints share it.
MAX_SOCKET_PATH = 107


def default_state_dir() -> Path:
    """The embedded default: ``$XDG_STATE_HOME/sensorium`` or ``~/.local/state/sensorium``."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "sensorium"


def resolve_state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``--state-dir`` wins, then ``SENSORIUM_STATE_DIR``, then the embedded default."""
    if explicit:
        return Path(explicit).expanduser().absolute()
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env).expanduser().absolute()
    return default_state_dir()


@dataclass(frozen=True)
class StatePaths:
    """Every path under one state directory (DESIGN §2). Each is worked out once: they
    are asked for on every directive."""

    root: Path

    @cached_property
    def config(self) -> Path:
        return self.root / "config"

    @cached_property
    def node_config(self) -> Path:
        return self.config / "node.json"

    @cached_property
    def connectors_config(self) -> Path:
        return self.config / "connectors"

    @cached_property
    def signatures(self) -> Path:
        return self.config / ".signatures"

    @cached_property
    def keys(self) -> Path:
        return self.root / "keys"

    @cached_property
    def run(self) -> Path:
        return self.root / "run"

    @cached_property
    def logs(self) -> Path:
        return self.root / "logs"

    @cached_property
    def recordings(self) -> Path:
        """Client requests recorded for ``sensorium replay`` (files 0600)."""
        return self.root / "recordings"

    @cached_property
    def storage(self) -> Path:
        return self.root / "storage"

    @cached_property
    def audit_db(self) -> Path:
        return self.storage / "audit.sqlite"

    @cached_property
    def registry_db(self) -> Path:
        return self.storage / "deferred-operations.sqlite"

    @cached_property
    def connector_os(self) -> Path:
        return self.root / "connectors" / "os"

    @cached_property
    def connector_jobs_db(self) -> Path:
        return self.connector_os / "jobs.sqlite"

    @cached_property
    def connector_starts_db(self) -> Path:
        return self.connector_os / "starts.sqlite"

    @cached_property
    def scratch(self) -> Path:
        return self.connector_os / "scratch"

    @cached_property
    def artifacts(self) -> Path:
        return self.root / "artifacts" / "sha256"

    def log_file(self, process: str) -> Path:
        return self.logs / f"{process}.jsonl"

    def ipc(self, name: str) -> str:
        """An ``ipc://`` endpoint in the 0700 run directory."""
        path = self.run / f"{name}.sock"
        if len(str(path).encode()) > MAX_SOCKET_PATH:
            raise StatePathError(
                f"socket path {path} is {len(str(path).encode())} bytes; the kernel allows "
                f"{MAX_SOCKET_PATH}. Use a shorter --state-dir."
            )
        return f"ipc://{path}"

    def ensure(self) -> None:
        """Create the tree; private directories are 0700 whatever the umask says."""
        for d in (
            self.root,
            self.config,
            self.connectors_config,
            self.storage,
            self.logs,
            self.connector_os,
            self.scratch,
            self.artifacts,
        ):
            d.mkdir(parents=True, exist_ok=True)
        for private in (self.root, self.run, self.keys, self.signatures):
            private.mkdir(parents=True, exist_ok=True)
            os.chmod(private, 0o700)


class StatePathError(Exception):
    """The state directory cannot hold what Sensorium needs to put there."""
