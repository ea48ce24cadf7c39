"""Node configuration (``config/node.json``): the one place every default lives.

The file is optional; whatever it names overrides these defaults, and an unknown
or mistyped key is an error with its path, never a silent default.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from sensorium.shared.files import read_regular
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import SensitivityClass
from sensorium.shared.wire.signature import TrustedSigner

Seconds = Annotated[float, msgspec.Meta(gt=0, le=86_400)]
SecondsOrZero = Annotated[float, msgspec.Meta(ge=0, le=86_400)]
Count = Annotated[int, msgspec.Meta(ge=1)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Endpoints(_Section, frozen=True, kw_only=True):
    """``None`` means an ``ipc://`` socket in ``<state>/run/`` (mode 0700).

    Core and the connector may instead listen on ``tcp://HOST:PORT``, served only with
    CurveZMQ (keys from ``sensorium keys curve init``; a process refuses to start
    without them). The supervisor's control socket is ipc only.
    """

    core: str | None = None
    connector: str | None = None
    supervisor: str | None = None

    def __post_init__(self) -> None:
        for name in ("core", "connector", "supervisor"):
            value = getattr(self, name)
            if value is None:
                continue
            if value.startswith("ipc://"):
                if not value[len("ipc://") :].startswith("/"):
                    raise ValueError(f"{name}: an ipc endpoint must be an absolute path")
            elif value.startswith("tcp://") and name != "supervisor":
                host, _, port = value[len("tcp://") :].rpartition(":")
                if not host or "*" in host or not port.isdigit() or not 0 < int(port) < 65536:
                    raise ValueError(
                        f"{name}: a tcp endpoint is tcp://HOST:PORT with a host clients can "
                        "reach (no '*') and a port in 1-65535"
                    )
            else:
                kinds = "ipc://" if name == "supervisor" else "ipc:// or tcp://"
                raise ValueError(f"{name}: endpoint must start with {kinds}")


class Limits(_Section, frozen=True, kw_only=True):
    max_message_bytes: Count = 4 * 1024 * 1024
    # A flow's templates render within this much counted work (template and expression
    # nodes, sizes of the values built): the same verdict on any machine. Generous for
    # a step's parameters (a map over ten thousand small objects is ~200,000 steps), far
    # below a template that would hold the render worker for long.
    flow_render_budget_steps: Count = 250_000
    # And, only as a safety net behind the budget, within this wall-clock time.
    flow_render_timeout_s: Seconds = 30.0
    core_max_inflight: Count = 1024
    connector_max_inflight: Count = 256
    # Spawns running at once; more wait their turn inside the connector.
    connector_max_concurrent_spawns: Count = 64
    # Upper bound on any action's max_timeout_ms, whatever its declaration says.
    max_action_timeout_ms: Count = 600_000
    # Time beyond an action's timeout that a caller waits for its reply: the
    # SIGTERM grace (5 s), the drain, and the hops.
    reply_margin_ms: Count = 15_000
    sigterm_grace_s: Seconds = 5.0
    # When the connector itself is told to stop, its running actions get SIGTERM at
    # once and SIGKILL after this much (short: the stop should not wait on them).
    stop_grace_s: Seconds = 1.0
    # How long a finished directive's idempotency/key keeps answering retries.
    idempotency_window_s: Seconds = 86_400.0
    # The most outcome records one `sensorium.audit.query` page carries, whatever it asks.
    audit_page_max: Count = 200
    # How often core brings async directives' admitted outcome records to their end.
    audit_sweep_s: Seconds = 2.0
    # Core says READY=1 once it holds the connector's report, so that a directive sent
    # the moment a node is ready finds the catalog; without a report this long after its
    # socket is bound it says READY anyway, serving (connector-unavailable) until one
    # comes. 0: READY at once. At most half of supervisor.ready_timeout_s (checked: the
    # rest is core's own start), and well under the unit's TimeoutStartSec (60 s).
    core_ready_wait_s: SecondsOrZero = 5.0


class SupervisorConfig(_Section, frozen=True, kw_only=True):
    ready_timeout_s: Seconds = 30.0
    # The first restart's wait, doubled for each crash within burst_window_s: systemd's
    # RestartSec default (100 ms). An isolated crash costs little; a loop still slows.
    backoff_initial_s: Seconds = 0.1
    backoff_max_s: Seconds = 30.0
    backoff_jitter: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.25
    # systemd's StartLimitBurst/StartLimitIntervalSec: past it a process is `failed`.
    burst_limit: Count = 5
    burst_window_s: Seconds = 10.0
    shutdown_budget_s: Seconds = 10.0
    sample_interval_s: Seconds = 5.0
    max_rss_bytes: Count = 2 * 1024 * 1024 * 1024
    max_fds: Count = 4096
    watchdog_s: Seconds = 30.0


class SandboxConfig(_Section, frozen=True, kw_only=True):
    """The kernel envelope every action runs in (DESIGN §6)."""

    # Ids an action runs as when the connector is root (65534 is `nobody`).
    uid: Annotated[int, msgspec.Meta(ge=1)] = 65534
    gid: Annotated[int, msgspec.Meta(ge=1)] = 65534
    # Each action's scratch is a tmpfs of this size: a disk cannot be filled from it.
    scratch_max_bytes: Count = 64 * 1024 * 1024
    # RLIMIT_NPROC for the action: a fork bomb stops here. Every action has a user
    # namespace of its own, so the count is its own, not shared by all actions.
    max_processes: Count = 256
    # RLIMIT_NOFILE for the action.
    max_open_files: Count = 1024
    # RLIMIT_DATA (heap and private writable mappings) of each of the action's
    # processes, unless its declaration's limits.memory_max_bytes says less.
    max_memory_bytes: Count = 1024 * 1024 * 1024


class EgressConfig(_Section, frozen=True, kw_only=True):
    """C4's relay (DESIGN §6). Each relayed connection holds two of the connector's file
    descriptors (the action's side and the host's), so the relay's share of the
    connector's fds is bounded well below ``supervisor.max_fds``: an action that opens
    more has the extra connections refused (``envelope-violation``), never the node.
    """

    # Relayed connections one action may hold open at once.
    max_connections_per_action: Count = 256
    # Relayed connections open at once across every action the connector runs.
    max_connections_total: Count = 1024
    # Whether a declared name may resolve to a private address (RFC 1918, IPv6
    # unique-local). Loopback, link-local, unspecified and multicast answers are
    # refused to names either way; a declared IP literal is reached as declared.
    allow_private_answers: bool = True


class DeferredConfig(_Section, frozen=True, kw_only=True):
    """``DeferredHostPolicy`` and the machinery that applies it (DESIGN §7, seed 055).

    Connector hints are clamped into these bounds; nothing a connector or caller
    says can keep an operation alive past ``max_ttl_s``.
    """

    min_retry_s: Seconds = 1.0
    max_retry_s: Seconds = 60.0
    # The host's maximum operation lifetime: 15 minutes (seed 055, resolved question 4).
    max_ttl_s: Seconds = 900.0
    # Polls that said pending/running before the host gives up (-> timed-out).
    max_attempts: Count = 600
    # A poll is due somewhere in [retry, retry * (1 + jitter)]: never earlier.
    jitter: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    # A claimed poll not finished within this is reclaimed (its poller died; a poller
    # that knows its predecessor is gone reclaims at once).
    lease_s: Seconds = 30.0
    # Past its expiry an operation still gets a final poll (the connector may hold its
    # terminal result); unanswered this long after expiry, it is declared expired.
    final_poll_grace_s: Seconds = 60.0
    # How long one status poll waits for core's answer.
    poll_timeout_s: Seconds = 10.0
    # The poller claims what is due at most this often, so the operations due within
    # one tick share a lease write, one message to core and one record transaction
    # (a poll starts at most this late; never early). Each tick costs ~1 ms of CPU
    # across the three processes: 0.2 s keeps 200 open operations under 6 % of a core
    # (bench/deferred_idle.py). Polls are the backstop: a job's end reaches core and
    # `wait` at once through the connector's completion hint, not at the next poll.
    poll_tick_s: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    max_concurrent_polls: Count = 64
    # Polls in flight at once against one owner module. A node has one module today,
    # so the default lets it use every slot: 1,000 operations at the 1 s minimum need
    # ~900 polls/s, which 16 in flight cannot carry (bench/poller_punctuality.py).
    per_module_max_polls: Count = 64
    # Terminal records are kept this long (at least 24 h), then collected in batches.
    retention_s: Annotated[float, msgspec.Meta(ge=86_400, le=366 * 86_400)] = 72 * 3600.0
    gc_batch: Count = 500
    # Connector-owned jobs: how many run at once, and how many may wait for a slot.
    connector_max_running_jobs: Count = 8
    connector_max_pending_jobs: Count = 1024


class OrphanConfig(_Section, frozen=True, kw_only=True):
    """The orphan-event queue (seed 003, section 4): events no directive or operation
    claims wait ``ttl_s`` for their owner to appear, then are quarantined."""

    ttl_s: Seconds = 300.0
    # Past this many queued orphans a new one is quarantined at once ("queue-full").
    max_queued: Count = 1000
    reconcile_interval_s: Seconds = 5.0
    # Recovered orphans and settled dispatch records are collected after this;
    # quarantined ones are kept for an operator to read.
    retention_s: Annotated[float, msgspec.Meta(ge=86_400, le=366 * 86_400)] = 72 * 3600.0
    quarantine_retention_s: Annotated[float, msgspec.Meta(ge=86_400, le=366 * 86_400)] = (
        30 * 86_400.0
    )


class LogConfig(_Section, frozen=True, kw_only=True):
    """``logs/<process>.jsonl``: rotated by size, reopened on SIGHUP (for logrotate)."""

    # Past this size a process renames its file to ``.1`` (older ones shift up) and
    # starts a new one; 0 never rotates (leave it to logrotate and SIGHUP).
    max_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024 * 1024
    # Rotated files kept per process (``.1`` … ``.keep``); the oldest is deleted.
    keep: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5


class RecordConfig(_Section, frozen=True, kw_only=True):
    """Recording client requests for ``sensorium replay`` (DESIGN §8)."""

    # A recording stops by itself at either bound, saying so in its summary.
    max_requests: Count = 1_000_000
    max_bytes: Count = 256 * 1024 * 1024


class ObservationConfig(_Section, frozen=True, kw_only=True):
    """Observations core admits (``sensorium-observation.v1``, proposal 045 §7)."""

    # How long an admitted record is kept (its ``admission.store.ttl_sec``). Expired
    # records are never read and are pruned as new ones arrive, a bounded number each.
    store_ttl_s: Annotated[int, msgspec.Meta(ge=1, le=366 * 86_400)] = 7 * 86_400
    # The freshness horizon consumers are told (``freshness.ttl_sec``), never longer
    # than the store keeps the record.
    freshness_ttl_s: Annotated[int, msgspec.Meta(ge=1, le=366 * 86_400)] = 3600
    # The most records one ``sensorium.observe.query`` page carries, whatever it asks.
    max_page: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500


class ConsentConfig(_Section, frozen=True, kw_only=True):
    """Core's sensitivity/consent policy before dispatch (seed 048's responsibility split).

    An action's sensitivity is its class's baseline (C6: the strictest of what it
    composes) raised by its declaration's ``sensitivity``. Up to this class a caller
    may trigger it as it is; above it, core refuses (``consent-required``) unless the
    directive carries ``consent/sensitivity`` at least that strict. The default lets
    every published class but ``sensitive-personal`` run without consent (proposal
    045: camera, microphone, location — "explicit consent required").
    """

    max_sensitivity_without_consent: SensitivityClass = "private"


class NodeConfig(_Section, frozen=True, kw_only=True):
    endpoints: Endpoints = msgspec.field(default_factory=Endpoints)
    # Operator keys whose catalog signatures this node accepts (the node-self key always is).
    trusted_signers: list[TrustedSigner] = msgspec.field(default_factory=list)
    limits: Limits = msgspec.field(default_factory=Limits)
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)
    egress: EgressConfig = msgspec.field(default_factory=EgressConfig)
    deferred: DeferredConfig = msgspec.field(default_factory=DeferredConfig)
    orphans: OrphanConfig = msgspec.field(default_factory=OrphanConfig)
    logs: LogConfig = msgspec.field(default_factory=LogConfig)
    record: RecordConfig = msgspec.field(default_factory=RecordConfig)
    observations: ObservationConfig = msgspec.field(default_factory=ObservationConfig)
    consent: ConsentConfig = msgspec.field(default_factory=ConsentConfig)


MAX_NODE_CONFIG_BYTES = 1024 * 1024
# The connector's own fds beside the relay's (sockets, databases, each running action's
# pipes and sandbox fds): what ``egress.max_connections_total`` must leave free.
CONNECTOR_FD_HEADROOM = 1024


class ConfigError(Exception):
    """A configuration file is unreadable or invalid; the message names the file and path."""


def load_node_config(paths: StatePaths) -> NodeConfig:
    try:
        raw = read_regular(paths.node_config, MAX_NODE_CONFIG_BYTES)
    except FileNotFoundError:
        return NodeConfig()
    except OSError as exc:
        raise ConfigError(f"cannot read {paths.node_config}: {exc.strerror or exc}") from exc
    try:
        cfg = msgspec.json.decode(raw, type=NodeConfig)
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8
        raise ConfigError(f"{paths.node_config}: {exc!s:.300}") from exc
    limits = cfg.limits
    if limits.reply_margin_ms < limits.sigterm_grace_s * 1000 + 1000:
        raise ConfigError(
            f"{paths.node_config}: limits.reply_margin_ms ({limits.reply_margin_ms}) must exceed "
            f"the SIGTERM grace ({limits.sigterm_grace_s} s) by at least 1000 ms, or every "
            "timed-out action would look like a lost reply"
        )
    if limits.core_ready_wait_s > cfg.supervisor.ready_timeout_s / 2:
        raise ConfigError(
            f"{paths.node_config}: limits.core_ready_wait_s ({limits.core_ready_wait_s} s) "
            f"must be at most half of supervisor.ready_timeout_s "
            f"({cfg.supervisor.ready_timeout_s} s), or a core waiting for an absent "
            "connector could be killed as never ready"
        )
    e, fds = cfg.egress, cfg.supervisor.max_fds
    if e.max_connections_per_action > e.max_connections_total:
        raise ConfigError(
            f"{paths.node_config}: egress.max_connections_per_action "
            f"({e.max_connections_per_action}) exceeds egress.max_connections_total "
            f"({e.max_connections_total})"
        )
    if 2 * e.max_connections_total + CONNECTOR_FD_HEADROOM > fds:
        raise ConfigError(
            f"{paths.node_config}: egress.max_connections_total ({e.max_connections_total}) "
            f"takes two fds each and must leave {CONNECTOR_FD_HEADROOM} of "
            f"supervisor.max_fds ({fds}) to the connector: at most "
            f"{max(0, (fds - CONNECTOR_FD_HEADROOM) // 2)}"
        )
    d = cfg.deferred
    if d.min_retry_s > d.max_retry_s or d.max_retry_s > d.max_ttl_s:
        raise ConfigError(
            f"{paths.node_config}: deferred needs min_retry_s <= max_retry_s <= max_ttl_s "
            f"(have {d.min_retry_s}, {d.max_retry_s}, {d.max_ttl_s})"
        )
    return cfg


def core_endpoint(cfg: NodeConfig, paths: StatePaths) -> str:
    return cfg.endpoints.core or paths.ipc("core")


def connector_endpoint(cfg: NodeConfig, paths: StatePaths) -> str:
    return cfg.endpoints.connector or paths.ipc("connector")


def supervisor_endpoint(cfg: NodeConfig, paths: StatePaths) -> str:
    return cfg.endpoints.supervisor or paths.ipc("supervisor")
