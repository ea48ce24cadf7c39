"""Spawn latency of action classes C2–C6, end to end through core, against bwrap and a bare spawn.

Measured: blocking ``Client.invoke`` of one action per class whose program is
``/usr/bin/true`` (C2: ``true`` as the interpreter of a one-line script; C3–C6 with
their write root, endpoint and artifact blocks declared, so every mechanism of the
class is built and torn down, the C3 commit and C5 promotion included). C1 is not
repeated here: it is invoke_true.py's ``bench.true``, against the same peers. Peers, in
the same run and interleaved: bubblewrap with the namespaces of ``_harness.BWRAP_TRUE``
(``--unshare-all --die-with-parent --new-session --ro-bind / / --tmpfs /tmp --proc
/proc --dev /dev /usr/bin/true``; empty, and said so, where bwrap cannot run), util-linux
``unshare`` (``_harness.UNSHARE_TRUE``) and
``subprocess.run(["/usr/bin/true"])``. Median and p99 of each; ratios are class / peer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import (
    BWRAP_TRUE,
    UNSHARE_TRUE,
    bwrap_missing,
    emit,
    machine,
    parse_args,
    row,
    runtime,
    summary_us,
    unshare_missing,
)

from sensorium.client import Client

TRUE = "/usr/bin/true"
WARMUP = 10
ITERATIONS = 100
SANDBOX_UID = 65534
CLASSES = {
    "bench.c2": "C2 allowlisted-script",
    "bench.c3": "C3 scoped-fs-write",
    "bench.c4": "C4 egress-network-spawn",
    "bench.c5": "C5 artifact-producing-spawn",
    "bench.c6": "C6 composed-spawn",
}
NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}


def _decl(action_id: str, cls: str, **extra: Any) -> dict[str, Any]:
    return {
        "action_id": action_id,
        "class": cls,
        "executable": {"kind": "binary", "path": TRUE, "argv_shape": ["true"]},
        "parameters_schema": NO_PARAMS,
        "default_timeout_ms": 5000,
        "max_timeout_ms": 10000,
        **extra,
    }


def catalog(fixtures: Path) -> dict[str, Any]:
    scripts = fixtures / "scripts"
    scripts.mkdir()
    script = scripts / "noop.sh"
    script.write_text("# nothing to do\n")
    write_root = fixtures / "write-root"
    write_root.mkdir()
    os.chown(write_root, SANDBOX_UID, SANDBOX_UID)
    fs_write = {
        "write_root": str(write_root),
        "max_bytes_total": 1 << 20,
        "max_bytes_per_file": 1 << 16,
    }
    egress = {
        "endpoints": [{"host": "localhost", "port": 9, "protocol": "tcp"}],
        "max_bytes_total": 1024,
        "max_bytes_per_connection": 1024,
    }
    artifact = {
        "max_count": 1,
        "max_bytes_per": 1024,
        "max_bytes_total": 1024,
        "allowed_media_types": ["text/plain"],
    }
    actions = [
        {
            **_decl("bench.c2", "allowlisted-script"),
            "executable": {
                "kind": "script",
                "path": str(script),
                "interpreter": TRUE,
                "argv_shape": ["true", str(script), "--params-json", "{{params_json}}"],
                "sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
            },
            "script": {"allowed_roots": [str(scripts)]},
        },
        _decl("bench.c3", "scoped-fs-write", fs_write=fs_write),
        _decl("bench.c4", "egress-network-spawn", egress_network=egress),
        _decl("bench.c5", "artifact-producing-spawn", artifact=artifact),
        _decl(
            "bench.c6",
            "composed-spawn",
            composed={"effects": ["read", "scoped-fs-write", "egress-network", "artifact-produce"]},
            fs_write=fs_write,
            egress_network=egress,
            artifact=artifact,
        ),
    ]
    return {"schema": "sensorium-os-config.v1", "action_catalog": actions}


def _time(fn: Any) -> int:
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


def run() -> dict[str, Any]:
    # Fixtures outside /tmp: every action sees its own empty /tmp.
    fixtures = Path(tempfile.mkdtemp(prefix="sensorium-bench-", dir="/var/tmp"))
    fixtures.chmod(0o755)
    no_bwrap = bwrap_missing()
    no_unshare = unshare_missing()
    try:
        with runtime(dropin=catalog(fixtures)) as rt, Client(state_dir=str(rt.state_dir)) as client:
            ids = list(CLASSES)

            def invoke(aid: str) -> None:
                out = client.invoke(aid, {})
                if out.status != "completed":
                    raise AssertionError(f"{aid}: {out.status} {out.stderr.text} {out.diagnostics}")

            samples: dict[str, list[int]] = {k: [] for k in [*ids, "bwrap", "unshare", "spawn"]}
            for _ in range(WARMUP):
                for aid in ids:
                    invoke(aid)
            for _ in range(ITERATIONS):
                for aid in ids:
                    samples[aid].append(_time(lambda aid=aid: invoke(aid)))
                if no_bwrap is None:
                    samples["bwrap"].append(_time(lambda: subprocess.run(BWRAP_TRUE, check=True)))
                if no_unshare is None:
                    samples["unshare"].append(
                        _time(lambda: subprocess.run(UNSHARE_TRUE, check=True))
                    )
                samples["spawn"].append(_time(lambda: subprocess.run([TRUE], check=True)))
    finally:
        shutil.rmtree(fixtures, ignore_errors=True)
    stats = {k: summary_us(v) for k, v in samples.items() if v}
    rows = []
    for aid in ids:
        s = stats[aid]
        bench = f"invoke {aid} ({CLASSES[aid]})"
        for q in ("median_us", "p99_us"):
            metric = q.removesuffix("_us")
            bw = stats.get("bwrap")
            rows.append(
                row(bench, metric, s[q], bw[q] if bw else None, unit="µs", peer_name="bwrap")
            )
            un = stats.get("unshare")
            rows.append(
                row(bench, metric, s[q], un[q] if un else None, unit="µs", peer_name="unshare")
            )
            rows.append(
                row(bench, metric, s[q], stats["spawn"][q], unit="µs", peer_name="subprocess.run")
            )
    notes = [] if no_bwrap is None else [f"class_spawn: the bwrap column is empty: {no_bwrap}"]
    if no_unshare is not None:
        notes.append(f"class_spawn: the unshare column is empty: {no_unshare}")
    return {
        "bench": "class_spawn",
        "rows": rows,
        "stats_us": stats,
        "machine": machine(),
        "notes": notes,
    }


def main() -> None:
    args = parse_args(__doc__)
    emit(run(), args.json)


if __name__ == "__main__":
    main()
