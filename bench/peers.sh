#!/usr/bin/env bash
# The peers the benchmarks compare against (huey, circus), in a venv of their own so that
# nothing about them touches sensorium's environment. Idempotent; run_all.py calls it when
# neither this venv nor the running interpreter has them. The same packages are the
# `bench` extra (`pip install -e '.[bench]'`) for those who prefer one environment.
set -euo pipefail
peers="${SENSORIUM_BENCH_PEERS:-/tmp/sensorium-bench-peers}"
python="${PYTHON:-python3}"
if [ ! -x "$peers/bin/python" ]; then
    "$python" -m venv "$peers"
fi
# bubblewrap is the sandboxed-spawn peer (invoke_true.py, class_spawn.py): Debian's.
if ! command -v bwrap >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null || true
fi
"$peers/bin/python" -m pip install --quiet --disable-pip-version-check 'huey>=2.5' 'circus>=0.19'
"$peers/bin/python" -c 'import circus, huey; print("peers:", "circus", circus.__version__, "huey", huey.__version__)'
