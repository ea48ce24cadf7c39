#!/usr/bin/env bash
# Runs the image with the given `podman run` options and reports what works:
# the node's tier, the factory action, then one action per class C2–C5 from
# check/50-check-classes.json (installed as a drop-in, signed by a fresh operator key).
#
#   deploy/container/check.sh NAME [podman run options ...]
#   deploy/container/check.sh plain
#   deploy/container/check.sh full --security-opt unmask=ALL --cap-add SYS_ADMIN
#
# Environment: IMAGE (default sensorium:latest), PODMAN (default "podman"; on a
# cgroup v1 host: PODMAN="podman --runtime runc --cgroup-manager=cgroupfs"),
# KEEP=1 to leave the container running afterwards. Exit status: 0 when every
# invoked action completed, 1 otherwise.
set -uo pipefail

name=${1:?usage: check.sh NAME [podman run options ...]}
shift
IMAGE=${IMAGE:-sensorium:latest}
PODMAN=${PODMAN:-podman}
here=$(cd "$(dirname "$0")" && pwd)
p() { $PODMAN "$@"; }
x() { p exec "$name" "$@"; }

wait_ready() {  # until the connector reports ready (or 90 s)
    for _ in $(seq 90); do
        x sensorium status 2>/dev/null | grep -q '^connector *ready' && return 0
        sleep 1
    done
    echo "check.sh: connector not ready after 90 s" >&2
    x sensorium status >&2
    return 1
}

dump_logs() {
    echo "--- logs (errors, tracebacks, stderr) ---"
    x sh -c 'cd "$SENSORIUM_STATE_DIR/logs" && grep -h "\"level\": *\"\(error\|critical\)\"\|Traceback" *.jsonl; for f in *.stderr; do [ -s "$f" ] && { echo "== $f"; tail -n 40 "$f"; }; done' 2>&1
}

p rm -f -v "$name" >/dev/null 2>&1
p run -d --name "$name" --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    -v "$here/check:/opt/sensorium-check:ro" "$@" "$IMAGE" >/dev/null || exit 1
trap '[ "${KEEP:-0}" = 1 ] || p rm -f -v "$name" >/dev/null 2>&1' EXIT

fail=0
wait_ready || { dump_logs; exit 1; }
echo "=== node user: uid $(x id -u)"
echo "=== factory: demo.fs.read-head"
x sensorium invoke demo.fs.read-head --param path=/etc/os-release --param lines=2 || fail=1

# One action per class: a write root the node's uid owns, a local HTTP server for C4.
x sh -c 'mkdir -p "$SENSORIUM_STATE_DIR/config/connectors/sensorium-os.d" &&
    cp /opt/sensorium-check/50-check-classes.json "$SENSORIUM_STATE_DIR/config/connectors/sensorium-os.d/"'
p exec -u root "$name" install -d -o "$(x id -u)" -g "$(x id -g)" /srv/sensorium-check/write
p exec -d "$name" python3 -m http.server 8765 --bind 127.0.0.1 --directory /opt/sensorium-check >/dev/null
{ x sensorium keys new --participant did:example:container-check --trust \
  && x sensorium catalog sign --yes \
  && x sensorium restart connector; } >/dev/null || { echo "check.sh: signing failed" >&2; fail=1; }
sleep 1
wait_ready || { dump_logs; exit 1; }

echo "=== ledger"
x sensorium ledger
echo "=== doctor"
x sensorium doctor 2>/dev/null || echo "(this sensorium has no doctor command)"
for a in check.c2.script check.c3.write check.c4.fetch check.c5.produce; do
    echo "=== invoke $a"
    if [ "$a" = check.c2.script ]; then
        x sensorium invoke "$a" --param text=hello || fail=1
    else
        x sensorium invoke "$a" || fail=1
    fi
done
echo "=== written by C3:"; x cat /srv/sensorium-check/write/written.txt 2>&1
dump_logs
exit "$fail"
