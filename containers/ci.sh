#!/usr/bin/env bash
# CI for the containers: build the CPU image from this checkout, run the smoke inside it (fast tests,
# the `smoke` study, its manifest, `reproduce` of that run from an empty cache), then reproduce the
# image's run on the host (`nox -s reproduce`): a run must give the same numbers in and out of it.
# Needs root (or sudo) for apt-get and for buildah's chroot isolation; no GPU, no image registry.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's engines and debootstrap, when missing (containers/build.py builds the base from them).
if ! { command -v buildah || command -v podman; } >/dev/null || ! command -v debootstrap >/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman debootstrap
fi
python3 -m pip install -q --disable-pip-version-check "nox==2026.10.20"  # as .ci/run pins it

start=$SECONDS
python3 -m nox -s container
built=$SECONDS
runs=$(mktemp -d -t drafter-lab-ci-XXXXXX)
# A green run leaves nothing behind; a red one keeps its runs for a look.
trap 'rc=$?; if [ $rc = 0 ]; then rm -rf "$runs"; else echo "containers/ci.sh: runs kept in $runs" >&2; fi' EXIT
python3 -m nox -s container -- smoke --runs "$runs"
smoked=$SECONDS
# The image's run must reproduce on the host too: same pinned corpus, same locked torch.
python3 -m nox -s reproduce -- "$runs/smoke" --runs "$runs" --cache "$runs/cache-host"
echo "containers/ci.sh: image $((built - start)) s, smoke $((smoked - built)) s," \
     "host reproduce $((SECONDS - smoked)) s, total $((SECONDS - start)) s"
