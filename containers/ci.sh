#!/usr/bin/env bash
# CI for the containers: build the CPU image from this checkout, then run the smoke inside it
# (fast tests, the `smoke` study, its manifest, `reproduce` of that run from an empty cache).
# Needs root (or sudo) for apt-get and for buildah's chroot isolation; no GPU, no image registry.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's engines and debootstrap, when missing (containers/build.py builds the base from them).
if ! { command -v buildah || command -v podman; } >/dev/null || ! command -v debootstrap >/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman debootstrap
fi
python3 -m pip install -q --disable-pip-version-check nox

start=$SECONDS
python3 -m nox -s container
built=$SECONDS
python3 -m nox -s container -- smoke
echo "containers/ci.sh: image $((built - start)) s, smoke $((SECONDS - built)) s, total $((SECONDS - start)) s"
