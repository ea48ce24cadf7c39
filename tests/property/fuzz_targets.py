"""Each input the node reads, fed the way its reader is fed, with the verdict it reaches.

A target returns ``ACCEPTED`` or the stable code its rejection carries; an invariant it
breaks (an uncoded exception, a reply that could not be encoded, a hang) raises. The
property tests in this folder and ``bench/fuzz_inputs.py`` share them.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import fuzz_examples as ex
import fuzz_strategies as hs
import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.connectors.os.catalog.authorization import (
    Reason,
    node_signer,
    sidecar_path,
    sign,
    verify,
)
from sensorium.connectors.os.envelope import argv as argv_mod
from sensorium.connectors.os.run.sandbox import fsprofile
from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import ALL_CODES, OsErrorCode, RuntimeErrorCode
from sensorium.shared.keys import KeyPair, node_key
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.sockets import DEFAULT_MAX_MESSAGE
from sensorium.shared.wire.client_api import ClientRequest, Invoke
from sensorium.shared.wire.deferred import (
    ConnectorDeferred,
    DeferredOperation,
    DeferredOperationStatus,
)
from sensorium.shared.wire.directive import parameters_problem
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.seam import ConnectorInvoke, SeamRequestUnion

ACCEPTED = "accepted"
# Rejections with no code of their own; the report names them (see test_wire_decoders).
REPLY_MALFORMED = "uncoded:reply-malformed"
# Every example gets this long before it counts as a hang (SIGALRM, main thread only).
EXAMPLE_BOUND_S = 5.0

# Reproducible in CI: the same examples on every run, nothing saved between runs.
PROPERTY = settings(
    database=None,
    derandomize=True,
    deadline=None,  # a loaded 2-core CI box makes timings noisy; EXAMPLE_BOUND_S is the bound
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Hang(AssertionError):
    pass


@contextlib.contextmanager
def bounded(seconds: float = EXAMPLE_BOUND_S) -> Iterator[None]:
    def alarm(_signum: int, _frame: object) -> None:
        raise Hang(f"no verdict within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def coded(code: str) -> str:
    assert code in ALL_CODES, f"{code!r} is not a stable diagnostic code"
    return code


# --- wire: what RpcServer does with a frame, and what a handler then relies on ---------

_enc = msgspec.msgpack.Encoder()
_client = msgspec.msgpack.Decoder(ClientRequest)
_seam = msgspec.msgpack.Decoder(SeamRequestUnion)


def _request(decoder: msgspec.msgpack.Decoder[Any], payload: bytes) -> str:
    if len(payload) > DEFAULT_MAX_MESSAGE:  # RpcServer._refuse, before decoding
        return coded(RuntimeErrorCode.REQUEST_TOO_LARGE)
    try:
        request = decoder.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return coded(RuntimeErrorCode.REQUEST_MALFORMED)
    # Handlers log, re-encode (core forwards a directive on the seam) and audit what they
    # got: a decoded request always encodes again, to itself.
    encoded = _enc.encode(request)
    assert _enc.encode(decoder.decode(encoded)) == encoded
    if isinstance(request, Invoke | ConnectorInvoke):  # within PARAMETERS_MAX_DEPTH
        assert parameters_problem(request.directive.parameters) is None
    return ACCEPTED


def client_request(payload: bytes) -> str:
    return _request(_client, payload)


def seam_request(payload: bytes) -> str:
    return _request(_seam, payload)


_RESULTS: dict[str, type[msgspec.Struct]] = {
    "outcome": Outcome,
    "deferred": DeferredOperation,
    "status": DeferredOperationStatus,
    "connector-deferred": ConnectorDeferred,
}


def reply(payload: bytes) -> str:
    """What a client does with a reply frame: the envelope, then ``unwrap``."""
    try:
        envelope = msgspec.msgpack.decode(payload, type=Reply)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return REPLY_MALFORMED
    if not envelope.ok:
        return (
            coded(envelope.error.code)
            if envelope.error and envelope.error.code in ALL_CODES
            else REPLY_MALFORMED
        )
    return result(bytes(envelope.result), "outcome")


def result(payload: bytes, kind: str) -> str:
    try:
        msgspec.msgpack.decode(payload, type=_RESULTS[kind])
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return REPLY_MALFORMED
    return ACCEPTED


# --- the catalog, its fs policy, the argv renderer -------------------------------------


def catalog(raw: bytes) -> str:
    """``catalog.merge`` as ``catalog.load`` calls it, on one source."""
    problems: list[catalog_mod.Problem] = []
    cat = catalog_mod.merge([("fuzz.json", raw)], problems)
    assert len(cat.problems) <= catalog_mod.MAX_PROBLEMS + 1
    for p in cat.problems:
        assert isinstance(p.message, str) and len(p.message) <= catalog_mod.MAX_PROBLEM_CHARS
        assert isinstance(p.field, str) and len(p.field) <= catalog_mod.MAX_PROBLEM_CHARS
    if cat.valid:
        assert len(cat.config_hash) == 64
        for decl in cat.declarations.values():
            assert argv_mod.check_template(decl) == []
        return ACCEPTED
    # Problems become catalog-invalid diagnostics in the module report (report.py).
    return coded(RuntimeErrorCode.CATALOG_INVALID)


def fs_policy(raw: Any, paths: list[str]) -> str:
    """``fsprofile.load_policy`` on a decoded policy, then every use the connector makes of
    an accepted one, on paths an action could name."""
    try:
        policy = fsprofile.load_policy(raw)
    except fsprofile.PolicyError as exc:
        assert exc.problems and all(
            isinstance(w, str) and isinstance(m, str) for w, m in exc.problems
        )
        # catalog.merge turns each problem into a catalog-invalid one.
        return coded(RuntimeErrorCode.CATALOG_INVALID)
    for name in [*policy.fsProfiles, fsprofile.UNRESTRICTED_FS_PROFILE]:
        profile = fsprofile.effective_profile(policy, name)
        for path in paths:
            for rules in (profile.read, profile.modify):
                assert isinstance(fsprofile.check_path(rules, path, base="/srv/work"), bool)
        plan = fsprofile.compile_read(profile, base="/srv/work")
        assert all(g.startswith("/") for g in plan.grants)
    return ACCEPTED


@dataclass(frozen=True)
class ArgvCase:
    shape: list[str]
    params: dict[str, Any]
    connector_values: dict[str, str]


def argv(case: ArgvCase) -> str:
    """``argv.render``; the connector maps a RenderError to parameters-invalid."""
    try:
        out = argv_mod.render(case.shape, case.params, case.connector_values)
    except argv_mod.RenderError:
        return coded(OsErrorCode.PARAMETERS_INVALID)
    assert len(out) == len(case.shape) and all(isinstance(e, str) for e in out)
    assert all("\0" not in e for e in out)
    assert sum(len(e.encode()) + 1 for e in out) <= argv_mod.ARGV_MAX_BYTES
    for element, rendered in zip(case.shape, out, strict=True):
        if not argv_mod.placeholders(element):
            assert rendered == element  # a literal element is never touched
    return ACCEPTED


# --- the signature sidecar -------------------------------------------------------------


class SidecarWorld:
    """A state dir whose node key signed a catalog: the genuine sidecar to break."""

    def __init__(self, root: Path) -> None:
        self.paths = StatePaths(root)
        self.paths.ensure()
        pair: KeyPair | None = node_key(self.paths)
        assert pair is not None
        self.config_hash = catalog_mod.factory_hash()
        self.genuine = msgspec.to_builtins(sign(self.config_hash, pair, node_signer(pair)))
        self.cfg = NodeConfig()

    def verdict(self, raw: bytes) -> str:
        path = sidecar_path(self.paths)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        v = verify(self.paths, self.cfg, self.config_hash)
        assert v.reason in get_args(Reason) and isinstance(v.message, str)
        if v.authorized:
            return ACCEPTED
        # The connector refuses every dispatch with this code, the reason in its detail.
        return coded(OsErrorCode.ACTION_CATALOG_UNAUTHORIZED) + f" ({v.reason})"


# --- registry --------------------------------------------------------------------------

paths_strategy = st.lists(
    st.lists(st.text(st.sampled_from("ab.*?x-"), min_size=1, max_size=12), max_size=8).map(
        lambda s: "/" + "/".join(p for p in s if p not in (".", ".."))
    ),
    min_size=1,
    max_size=4,
)


@dataclass(frozen=True)
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    run: Callable[[Any], str]


def targets(world: SidecarWorld | None = None) -> list[Target]:
    from fuzz_argv import argv_cases

    client = st.sampled_from(ex.CLIENT_REQUESTS).flatmap(hs.msgpack_bytes)
    seam = st.sampled_from(ex.SEAM_REQUESTS).flatmap(hs.msgpack_bytes)
    found: list[Target] = [
        Target("client-request", client, client_request),
        Target("seam-request", seam, seam_request),
        Target("reply", hs.msgpack_bytes(ex.REPLY), reply),
        Target(
            "reply-result",
            st.sampled_from(sorted(_RESULTS)).flatmap(
                lambda k: st.tuples(hs.msgpack_bytes(_valid_result(k)), st.just(k))
            ),
            lambda case: result(*case),
        ),
        Target("catalog", hs.json_bytes(ex.CATALOG), catalog),
        Target(
            "fs-policy",
            st.tuples(st.one_of(hs.mutated(ex.POLICY), hs.jsonish), paths_strategy),
            lambda case: fs_policy(*case),
        ),
        Target("argv", argv_cases(), argv),
    ]
    if world is not None:
        found.append(Target("sidecar", hs.json_bytes(world.genuine), world.verdict))
    return found


def _valid_result(kind: str) -> dict[str, Any]:
    return {
        "outcome": ex.OUTCOME,
        "deferred": ex.DEFERRED,
        "status": ex.DEFERRED_STATUS,
        "connector-deferred": ex.CONNECTOR_DEFERRED,
    }[kind]
