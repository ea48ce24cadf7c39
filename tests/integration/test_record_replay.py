"""Record client requests on a live node, replay them open loop, and read the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest
from harness import TEST_ACTIONS, Stack, deferrable_sleep, outcomes_per_key, running_stack

from sensorium.client import Client, RecordingActive, Rejected
from sensorium.shared.wire.client_api import ClientRequest, Invoke
from sensorium.shared.wire.recording import read_recording


@pytest.fixture(scope="module")
def node() -> Stack:
    with running_stack([*TEST_ACTIONS, deferrable_sleep("test.rec.defer")]) as s:
        yield s  # type: ignore[misc]


def _requests(path: Path) -> list[tuple[int, object]]:
    decoder = msgspec.msgpack.Decoder(ClientRequest)
    with path.open("rb") as fh:
        _header, entries = read_recording(fh)
        return [(e.t_ns, decoder.decode(e.request)) for e in entries]


def test_a_recording_replays_with_fresh_ids_and_its_errors_by_code(node: Stack) -> None:
    with Client(state_dir=str(node.paths.root)) as client:
        started = client.record_start("traffic")
        assert started.active and started.path
        with pytest.raises(RecordingActive):
            client.record_start("another")
        client.invoke("test.echo-args", {"value": "a"})
        time.sleep(0.3)
        for _ in range(2):  # a retry: one spawn, and one in the replay too
            client.invoke("test.echo-args", {"value": "k"}, idempotency_key="rec-key")
        with pytest.raises(Rejected):
            client.invoke("test.nope", {})
        stopped = client.record_stop()
    assert not stopped.active and stopped.stopped_reason == "operator"
    path = Path(str(stopped.path))
    assert path.stat().st_mode & 0o777 == 0o600
    invokes = [(t, r) for t, r in _requests(path) if isinstance(r, Invoke)]
    assert [r.directive.action_id for _, r in invokes] == ["test.echo-args"] * 3 + ["test.nope"]
    times = [t for t, _ in invokes]
    assert times == sorted(times) and times[1] - times[0] >= 300_000_000

    out = node.cli("replay", str(path), "--speed", "4", "--json", "-q")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["schema"] == "sensorium-replay-report.v1"
    assert report["by_method"]["sensorium.directive.invoke"] == 4
    assert report["errors"] == {"action-not-allowlisted": 1}
    assert report["sent"] == report["answered"] == stopped.requests
    assert report["ok"] == report["sent"] - 1
    assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p99_9"]
    # The replayed key is the recorded one made the run's own: one outcome each.
    keys = outcomes_per_key(node.paths)
    assert keys["rec-key"] == 1
    replayed = [k for k in keys if k.startswith("rec-key~")]
    assert len(replayed) == 1 and keys[replayed[0]] == 1

    text = node.cli("replay", str(path), "-q")
    assert text.returncode == 0, text.stderr
    assert "latency ms  p50" in text.stdout and "action-not-allowlisted" in text.stdout


def test_a_recording_stops_itself_at_its_bound(node: Stack) -> None:
    with Client(state_dir=str(node.paths.root)) as client:
        client.record_start("bounded", max_requests=2)
        for _ in range(4):
            client.health()
        status = client.record_status()
        assert not status.active
        assert (status.stopped_reason, status.requests) == ("max-requests", 2)
        with pytest.raises(Rejected) as taken:
            client.record_start("bounded")
        assert taken.value.code == "recording-invalid"
    out = node.cli("record", "status")
    assert out.returncode == 0 and "stopped (max-requests)" in out.stdout


def test_synthetic_load_reports_throughput_percentiles_and_codes(node: Stack) -> None:
    out = node.cli(
        "replay",
        "--synthetic",
        "test.echo-args",
        "--param",
        "value=x",
        "--rate",
        "40",
        "--duration",
        "1",
        "--json",
        "-q",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["sent"] == report["ok"] == 40 and report["errors"] == {}
    assert report["offered_rps"] == 40 and report["throughput_rps"] > 0
    assert set(report["latency_ms"]) >= {"p50", "p90", "p99", "p99_9", "max"}

    refused = node.cli(
        "replay",
        "--synthetic",
        "test.nope",
        "--rate",
        "20",
        "--duration",
        "0.5",
        "-q",
        "--fail-on-error",
    )
    assert refused.returncode == 1
    assert "action-not-allowlisted       10" in refused.stdout


def test_a_file_that_is_not_a_recording_is_refused_with_a_code(node: Stack, tmp_path: Path) -> None:
    bogus = tmp_path / "not.srec"
    bogus.write_bytes(b"\x00\x00\x00\x03abc")
    out = node.cli("replay", str(bogus), "-q")
    assert out.returncode == 1
    assert "recording-invalid" in out.stderr
    usage = node.cli("replay", "--synthetic", "test.echo-args")
    assert usage.returncode == 2 and "--rate" in usage.stderr


def test_the_quiet_before_the_first_request_and_the_pollers_traffic_are_not_replayed(
    node: Stack,
) -> None:
    with Client(state_dir=str(node.paths.root)) as client:
        client.record_start("quiet")
        time.sleep(1.0)  # nobody asks anything for a while
        op = client.invoke("test.rec.defer", {"seconds": 0.1}, mode="async")
        client.wait(op, 30)  # meanwhile the poller polls it through core
        stopped = client.record_stop()
    # (A client first reads the catalog for the action's default timeout_ms, which the
    # contract requires every directive to carry.)
    recorded = [
        r for r in _requests(Path(str(stopped.path))) if type(r[1]).__name__ != "CatalogDescribe"
    ]
    # The client's own invoke and waits are there; the poller's refresh polls are not.
    assert type(recorded[0][1]).__name__ == "Invoke" and recorded[0][0] >= 1_000_000_000
    assert not any(getattr(r, "refresh", False) for _, r in recorded), recorded
    span_s = (recorded[-1][0] - recorded[0][0]) / 1e9
    out = node.cli("replay", str(stopped.path), "--json", "-q")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # The recorded span from the first request, not the second of silence before it.
    assert abs(report["send_window_s"] - span_s) < 0.5, (report["send_window_s"], span_s)
    assert report["outcomes"]["admitted"] == 1  # an async invoke's result


def test_an_outcome_that_failed_counts_as_an_error_under_its_code(node: Stack) -> None:
    out = node.cli(
        "replay",
        "--synthetic",
        "test.exit",
        "--param",
        "code=3",
        "--rate",
        "10",
        "--duration",
        "0.5",
        "--json",
        "-q",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] == 0 and report["outcomes"] == {"failed": 5}
    assert sum(report["errors"].values()) == 5
