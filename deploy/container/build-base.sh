#!/usr/bin/env bash
# Builds the base image the Containerfile starts FROM, from Debian packages alone
# (no image registry needed): debootstrap a minimal bookworm root, import it.
#
#   sudo deploy/container/build-base.sh [IMAGE]        # default sensorium-base:bookworm
#
# Environment: MIRROR (default: the first Debian mirror in /etc/apt/sources.list*,
# else http://deb.debian.org/debian), SECURITY_MIRROR (default: derived, else
# http://deb.debian.org/debian-security), SUITE (default bookworm),
# PODMAN (default "podman"; extra global options may follow, e.g.
# PODMAN="podman --runtime runc --cgroup-manager=cgroupfs").
# Needs root (debootstrap creates device nodes and root-owned files), debootstrap,
# podman and the Debian archive keyring (debian-archive-keyring).
set -euo pipefail

IMAGE=${1:-sensorium-base:bookworm}
SUITE=${SUITE:-bookworm}
PODMAN=${PODMAN:-podman}

if [ "$(id -u)" -ne 0 ]; then
    echo "build-base.sh: run as root (debootstrap needs it)" >&2
    exit 1
fi
for tool in debootstrap ${PODMAN%% *}; do
    command -v "$tool" >/dev/null || { echo "build-base.sh: $tool not installed" >&2; exit 1; }
done

# The mirror this machine already uses: deb822 "URIs:" lines or one-line "deb URI suite".
find_mirror() {  # $1: a pattern the URI path must end with (debian or debian-security)
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    local f
    for f in "${files[@]}"; do
        [ -r "$f" ] || continue
        {
            sed -n 's/^[[:space:]]*URIs:[[:space:]]*//p' "$f" | tr ' ' '\n'
            sed -n 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f"
        } | grep -E "^https?://[^ ]+/$1/?\$" | head -n1 | sed 's:/*$::'
    done | head -n1
}
MIRROR=${MIRROR:-$(find_mirror debian)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-$(find_mirror debian-security)}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}

root=$(mktemp -d /var/tmp/sensorium-base.XXXXXX)
trap 'rm -rf --one-file-system "$root"' EXIT

echo "build-base.sh: debootstrap $SUITE from $MIRROR into $root" >&2
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR"

cat > "$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SOURCES
# Small images: no package lists or downloaded .debs in the layer.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb \
       "$root"/var/cache/apt/*.bin "$root"/var/log/* "$root"/tmp/*
# debootstrap copies the host's resolv.conf and hostname; the runtime provides its own.
: > "$root/etc/resolv.conf"
echo localhost > "$root/etc/hostname"

tar --numeric-owner --xattrs -C "$root" -c . \
    | $PODMAN import --change 'CMD ["/bin/bash"]' - "$IMAGE"
echo "build-base.sh: imported $IMAGE" >&2
