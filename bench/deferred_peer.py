"""Deferred operations, admission and completion, against huey with its SQLite storage.

The bounded job: ``/usr/bin/true``, killed past 5 s, output captured. N jobs (200 by
default) are admitted one after another by one caller, after a warm-up of 10.

Sensorium: ``bench.true`` declared ``execution_mode_support: either`` (deferred profile:
retry hint 1 s, the host minimum) in a signed drop-in; ``Client.invoke(..., mode=
"async")`` returns the ``deferred-operation.v1`` handle once the connector has persisted
the job and core has registered the operation (both fsync'd, ``synchronous=FULL``). The
connector runs at most ``connector_max_running_jobs`` = 8 jobs at once, each in its C1
envelope; the host registry learns the end when the connector answers core's standing
``ConnectorWatch`` (the poller's own polls, clamped to ≥ 1 s plus ≤ 20 % jitter, are the
fallback).

Sensorium alone (no peer runs these): a 0.3 s ``bench.sleep`` job run async (handle →
``Client.wait`` returns ``completed``, the wait held by the node) against the same job
run sync; and async admissions per second with 16 concurrent callers on one
``AsyncClient`` (60 s sleeps: 8 run, the rest queue; admission alone, group-committed).

huey: ``SqliteHuey`` (file in a fresh tmp dir, ``fsync=True``, WAL) and a consumer
with 8 worker threads (the same 8), polling the queue with ``--delay 0.1 --max-delay
1.0`` (huey's default max delay is 10 s; 1 s matches the host's poll minimum and favours
huey); the task runs the same program with ``subprocess.run(argv, timeout=5,
capture_output=True)``. Enqueue = the task call returning its ``Result``.

Measured on both sides the same way: admission = around the call that returns the
handle; completion = from that return until the caller first reads a final status, by
one sweeping thread reading each pending job's status every 20 ms (``_sweep.py``:
``Client.status`` per operation; ``Result.get()`` per task). ``Client.wait`` and huey's
blocking ``get`` would each add their own read pacing (0.2–2 s; 0.1–1 s) on top.

The accepted admission is also set against the bare pyzmq echo of ``_echo.py``
answering with core's own ``deferred-operation.v1`` reply, one echo round trip after
each admission.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from _echo import Echo, core_reply
from _harness import BENCH_TRUE_DROPIN, emit, machine, parse_args, row, runtime, summary_us
from _peers import HERE, INSTALL_HINT, peer_python
from _sweep import Check, Sweeper

from sensorium.client import Client
from sensorium.client.aio import AsyncClient
from sensorium.client.api import make_directive
from sensorium.shared.config import DeferredConfig
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Issuer
from sensorium.shared.wire.result import DirectiveResult

ISSUER = Issuer(module_id="sensorium-bench")
ACTION = "bench.true"
PROGRAM = ["/usr/bin/true"]
TIMEOUT_S = 5.0
JOBS = 200
WARMUP = 10
WORKERS = DeferredConfig().connector_max_running_jobs
SWEEP_TIMEOUT_S = 120.0
HUEY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 10.0
PEER_HUEY = f"huey SqliteHuey, {WORKERS} worker threads"
PEER_ECHO = "pyzmq DEALER→ROUTER msgspec echo"
SLEEP_ACTION = "bench.sleep"
SHORT_JOB_S = 0.3
SHORT_JOBS = 10
IN_FLIGHT = 16
IN_FLIGHT_S = 2.0
# Below connector_max_pending_jobs (1024), which would refuse the rest.
IN_FLIGHT_MAX = 900


def dropin() -> dict[str, Any]:
    doc = copy.deepcopy(BENCH_TRUE_DROPIN)
    doc["action_catalog"][0].update(
        execution_mode_support="either",
        deferred_profile={"preferred_retry_after_seconds": 1, "preferred_max_ttl_seconds": 120},
        default_timeout_ms=int(TIMEOUT_S * 1000),
    )
    # The same binary-action shape for a job that takes a while: the completion path and
    # the admissions that queue behind the running slots.
    sleep = copy.deepcopy(doc["action_catalog"][0])
    sleep.update(
        action_id=SLEEP_ACTION,
        executable={
            "kind": "binary",
            "path": "/usr/bin/sleep",
            "argv_shape": ["sleep", "{{seconds}}"],
        },
        parameters_schema={
            "type": "object",
            "properties": {"seconds": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$"}},
            "required": ["seconds"],
            "additionalProperties": False,
        },
        default_timeout_ms=60_000,
        max_timeout_ms=60_000,
    )
    doc["action_catalog"].append(sleep)
    return doc


def _async_request() -> Invoke:
    directive = make_directive(
        ACTION,
        {},
        issuer=ISSUER,
        timeout_ms=None,
        idempotency_key=None,
        correlation_id=None,
        mode="async",
    )
    return Invoke(request_id=new_id(), directive=directive)


def _connect(state_dir: Path) -> tuple[Check, Any]:
    client = Client(state_dir=str(state_dir))

    def check(operation_id: str) -> str | None:
        status = client.status(operation_id)
        return status.status if status.terminal else None

    return check, client.close


def run_sensorium(jobs: int) -> dict[str, Any]:
    admission: list[int] = []
    echo: list[int] = []
    with runtime(dropin=dropin()) as rt, Client(state_dir=str(rt.state_dir)) as client:
        _bytes, template = core_reply(client.endpoint, _async_request())
        with Echo(template) as peer:
            warm = []
            for _ in range(WARMUP):
                warm.append(client.invoke(ACTION, {}, mode="async"))
                peer.roundtrip(_async_request(), DirectiveResult)
            for op in warm:
                client.wait(op, deadline=60)
            sweeper = Sweeper(lambda: _connect(rt.state_dir), jobs, SWEEP_TIMEOUT_S)
            sweeper.start()
            for _ in range(jobs):
                t0 = time.perf_counter_ns()
                op = client.invoke(ACTION, {}, mode="async")
                t1 = time.perf_counter_ns()
                admission.append(t1 - t0)
                sweeper.add(op.operation_id, t1)
                echo.append(peer.roundtrip(_async_request(), DirectiveResult))
            swept = sweeper.result()
        waited, sync = _wait_vs_sync(client)
        rate, queued, cpu = _measured_in_flight(rt)
    return {
        "admission_ns": admission,
        "echo_ns": echo,
        **swept,
        "waited_ns": waited,
        "sync_ns": sync,
        "in_flight_rate": rate,
        "in_flight_n": queued,
        "in_flight_cpu_ms": cpu,
    }


def _wait_vs_sync(client: Client) -> tuple[list[int], list[int]]:
    """A ``SHORT_JOB_S`` job run async (handle → ``Client.wait`` returns completed) and
    the same job run sync (invoke → outcome), interleaved."""
    waited: list[int] = []
    sync: list[int] = []
    params = {"seconds": str(SHORT_JOB_S)}
    for _ in range(SHORT_JOBS):
        t0 = time.perf_counter_ns()
        client.invoke(SLEEP_ACTION, params)
        sync.append(time.perf_counter_ns() - t0)
        op = client.invoke(SLEEP_ACTION, params, mode="async")
        t1 = time.perf_counter_ns()
        final = client.wait(op, deadline=60)
        waited.append(time.perf_counter_ns() - t1)
        assert final.status == "completed", final
    return waited, sync


async def _in_flight(state_dir: Path) -> tuple[float, int]:
    """Admissions per second with ``IN_FLIGHT`` concurrent callers on one AsyncClient, of
    jobs that take long (the first 8 run, the rest queue): admission alone."""
    n = 0
    async with AsyncClient(state_dir=str(state_dir)) as client:
        end = time.monotonic() + IN_FLIGHT_S

        async def caller() -> None:
            nonlocal n
            while time.monotonic() < end and n < IN_FLIGHT_MAX:
                await client.invoke(SLEEP_ACTION, {"seconds": "60"}, mode="async")
                n += 1

        t0 = time.monotonic()
        await asyncio.gather(*(caller() for _ in range(IN_FLIGHT)))
        return n / (time.monotonic() - t0), n


def _measured_in_flight(rt: Any) -> tuple[float, int, dict[str, float]]:
    """``_in_flight`` and each node process's CPU (user + system) per admission, in ms."""
    procs = {name: psutil.Process(p.pid) for name, p in rt.procs.items()}
    before = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
    rate, n = asyncio.run(_in_flight(rt.state_dir))
    cpu = {
        name: (sum(p.cpu_times()[:2]) - before[name]) / max(n, 1) * 1000
        for name, p in procs.items()
    }
    return rate, n, cpu


def in_flight_only() -> dict[str, Any]:
    """The 16-in-flight admissions alone (``--in-flight-only``): for quick A/B rounds."""
    m = machine()
    with runtime(dropin=dropin()) as rt:
        rate, n, cpu = _measured_in_flight(rt)
    return {
        "name": "deferred_peer",
        "machine": m,
        "rows": [_in_flight_row(rate)],
        "notes": [_in_flight_note(n, cpu)],
    }


def _in_flight_row(rate: float) -> dict[str, Any]:
    return row(
        f"deferred admission, {IN_FLIGHT} in flight (1 AsyncClient)",
        "admissions/s",
        rate,
        None,
        unit="/s",
        higher_is_better=True,
    )


def _in_flight_note(n: int, cpu: dict[str, float]) -> str:
    per = ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items())
    return f"deferred, {IN_FLIGHT} in flight: {n} admissions; CPU per admission: {per}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


def run_huey(python: str, jobs: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="sb-huey-", dir="/tmp"))
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "SENSORIUM_BENCH_HUEY_DB": str(work / "huey.db"),
    }
    consumer_cmd = [
        python,
        "-m",
        "huey.bin.huey_consumer",
        "_huey_peer.huey",
        "--workers",
        str(WORKERS),
        "--worker-type",
        "thread",
        "--delay",
        "0.1",
        "--max-delay",
        "1.0",
        "--quiet",
    ]
    producer_cmd = [
        python,
        "-c",
        "import _huey_peer; _huey_peer.main()",
        "--jobs",
        str(jobs),
        "--warmup",
        str(WARMUP),
        "--timeout-s",
        str(TIMEOUT_S),
        "--sweep-timeout-s",
        str(SWEEP_TIMEOUT_S),
        "--",
        *PROGRAM,
    ]
    consumer: subprocess.Popen[bytes] | None = None
    producer: subprocess.Popen[bytes] | None = None
    try:
        with (work / "consumer.out").open("wb") as out:
            consumer = subprocess.Popen(
                consumer_cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        producer = subprocess.Popen(
            producer_cmd,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        stdout, stderr = producer.communicate(timeout=HUEY_TIMEOUT_S)
        if producer.returncode != 0:
            log = (work / "consumer.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"huey producer exited {producer.returncode}:\n{stderr.decode()[-2000:]}\n"
                f"--- consumer:\n{log}"
            )
        result: dict[str, Any] = json.loads(stdout)
        return result
    finally:
        for proc in (producer, consumer):
            if proc is not None:
                _stop(proc)
        shutil.rmtree(work, ignore_errors=True)


def run(jobs: int = JOBS) -> dict[str, Any]:
    m = machine()  # first, so the load average is not our own
    python = peer_python("huey")
    core = run_sensorium(jobs)
    peer = run_huey(python, jobs) if python is not None else None
    adm, echo = summary_us(core["admission_ns"]), summary_us(core["echo_ns"])
    done = summary_us(core["completion_ns"])
    enq = summary_us(peer["enqueue_ns"]) if peer else None
    pdone = summary_us(peer["completion_ns"]) if peer else None

    def ms(s: dict[str, float] | None, q: str) -> float | None:
        return s[q] / 1000 if s else None

    rows = [
        row(
            "deferred admission (async invoke → handle)",
            "median",
            adm["median_us"],
            enq["median_us"] if enq else None,
            unit="µs",
            peer_name=f"{PEER_HUEY}: enqueue",
        ),
        row(
            "deferred admission (async invoke → handle)",
            "p99",
            adm["p99_us"],
            enq["p99_us"] if enq else None,
            unit="µs",
            peer_name=f"{PEER_HUEY}: enqueue",
        ),
        row(
            "admission round-trip, accepted (async)",
            "median",
            adm["median_us"],
            echo["median_us"],
            unit="µs",
            peer_name=PEER_ECHO,
        ),
        row(
            "deferred completion (handle → final status read)",
            "median",
            ms(done, "median_us"),
            ms(pdone, "median_us"),
            unit="ms",
            peer_name=f"{PEER_HUEY}: result",
        ),
        row(
            "deferred completion (handle → final status read)",
            "p99",
            ms(done, "p99_us"),
            ms(pdone, "p99_us"),
            unit="ms",
            peer_name=f"{PEER_HUEY}: result",
        ),
        row(
            f"a {SHORT_JOB_S} s job run async (handle → Client.wait sees completed)",
            "median",
            ms(summary_us(core["waited_ns"]), "median_us"),
            ms(summary_us(core["sync_ns"]), "median_us"),
            unit="ms",
            peer_name="the same job run sync (invoke → outcome)",
        ),
        _in_flight_row(core["in_flight_rate"]),
    ]
    notes = [
        f"deferred: {SHORT_JOBS} pairs of a {SHORT_JOB_S} s sleep, sync then async + wait; "
        f"{core['in_flight_n']} async admissions of 60 s sleeps by {IN_FLIGHT} concurrent "
        f"callers on one AsyncClient (8 run, the rest wait in the connector's queue)",
        f"deferred: {jobs} jobs of {PROGRAM[0]} (timeout {TIMEOUT_S:.0f} s) admitted back to "
        f"back by one caller after {WARMUP} warm-up, {WORKERS} running at once on both sides; "
        f"final statuses sensorium {core['statuses']}"
        + (f", huey {peer['statuses']}" if peer else "")
        + "; completion is read by one thread sweeping every 20 ms (see deferred_peer.py); "
        "the connector tells core when a job ends (ConnectorWatch), so sensorium's is no longer "
        "bounded by the poller's first poll",
        _in_flight_note(core["in_flight_n"], core["in_flight_cpu_ms"]),
    ]
    if peer is None:
        notes.append(f"deferred: huey not found, its column is empty: {INSTALL_HINT}")
    return {
        "name": "deferred_peer",
        "machine": m,
        "sensorium": {"admission": adm, "completion": done, "echo": echo},
        "huey": {"enqueue": enq, "completion": pdone} if peer else None,
        "rows": rows,
        "notes": notes,
    }


def main() -> None:
    def extra(p: Any) -> None:
        p.add_argument("--jobs", type=int, default=JOBS)
        p.add_argument(
            "--in-flight-only",
            action="store_true",
            help=f"only the {IN_FLIGHT}-in-flight admissions (and CPU per admission)",
        )

    args = parse_args(__doc__, extra)
    emit(in_flight_only() if args.in_flight_only else run(args.jobs), args.json)


if __name__ == "__main__":
    main()
