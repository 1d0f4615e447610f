#!/usr/bin/env bash
# Build the gpuperfd container images from deploy/container/Containerfile.
#
#   bash scripts/image.sh [--mode local|registry] [--target telemetry|probes|all]
#                         [--tag VERSION] [--base-image IMAGE] [--pip-args ARGS] [--torch SPEC]
#
# Images: gpuperfd:VERSION (telemetry, no torch) and gpuperfd-probes:VERSION (with torch).
#
# Modes (GPUPERFD_IMAGE_MODE or --mode; the script prints the one it used):
#   local     no container registry and no network inside the build: the base is Debian
#             bookworm made by debootstrap (python3, python3-venv) and imported with
#             `podman import`; every Python package is downloaded by this host's pip into
#             the build context and installed from there with --no-index. torch is the
#             wheel found in $TORCH_WHEELS (default /opt/wheels; a CPU build on CI).
#   registry  the normal build elsewhere: BASE_IMAGE (python:3.11-slim-bookworm) is pulled,
#             the build installs dependencies from the package index (a CUDA build of torch:
#             pass --pip-args "--extra-index-url URL" for a specific CUDA version).
# Both modes use the same Containerfile and the exact pins of deploy/container/constraints.txt.
# Containers are built with podman (docker works for registry mode: CONTAINER_ENGINE=docker).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=${GPUPERFD_IMAGE_MODE:-local}
TARGET=all
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE_IMAGE=""
PIP_ARGS=""
TORCH="torch==2.13.0"
ENGINE=${CONTAINER_ENGINE:-podman}
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
LOCAL_BASE=localhost/gpuperfd-base:bookworm

die() { echo "image.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --mode) MODE=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --tag) VERSION=$2; shift 2 ;;
    --base-image) BASE_IMAGE=$2; shift 2 ;;
    --pip-args) PIP_ARGS=$2; shift 2 ;;
    --torch) TORCH=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case $MODE in local|registry) ;; *) die "--mode must be local or registry, not '$MODE'" ;; esac
case $TARGET in telemetry|probes|all) ;; *) die "--target must be telemetry, probes or all, not '$TARGET'" ;; esac
[ "$MODE" = local ] && [ "$ENGINE" != podman ] && die "local mode needs podman (podman import), not $ENGINE"

# podman and friends, from Debian (root on a Debian host; elsewhere install them yourself).
need=()
command -v "$ENGINE" >/dev/null 2>&1 || need+=(podman buildah runc)
[ "$MODE" = local ] && ! command -v debootstrap >/dev/null 2>&1 && need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || die "install ${need[*]} first"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"
fi
# crun fails in some sandboxes (and in CI here); runc works everywhere podman does.
ENGINE_ARGS=()
[ "$ENGINE" = podman ] && command -v runc >/dev/null 2>&1 && ENGINE_ARGS+=(--runtime runc)

CTX=$(mktemp -d /tmp/gpuperfd-image.XXXXXX)
trap 'rm -rf "$CTX"' EXIT
mkdir "$CTX/wheels"
cp deploy/container/Containerfile deploy/container/constraints.txt "$CTX/"

PYTHON=${PYTHON:-python3}
# The project's own wheel, built here in both modes (the build context stays small).
"$PYTHON" -m pip wheel -q --no-deps -w "$CTX/wheels" "$ROOT"

started=$(date +%s)
if [ "$MODE" = local ]; then
  BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE}
  PIP_ARGS="--no-index $PIP_ARGS"
  echo "image.sh: mode local: base $BASE_IMAGE (debootstrap), packages from this host's pip, torch from $TORCH_WHEELS"
  if [ "$BASE_IMAGE" = "$LOCAL_BASE" ] && ! podman image exists "$LOCAL_BASE"; then
    rootfs=$CTX/rootfs
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" >"$CTX/debootstrap.log" 2>&1 \
      || { tail -20 "$CTX/debootstrap.log" >&2; die "debootstrap failed"; }
    # apt's lists, docs and caches are not needed to run Python.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* \
           "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*
    tar --numeric-owner -C "$rootfs" -c . | podman import --message "debian bookworm minbase + python3 (debootstrap)" - "$LOCAL_BASE" >/dev/null
    rm -rf "$rootfs"
    echo "image.sh: made $LOCAL_BASE in $(( $(date +%s) - started )) s"
  fi
  # Every dependency as a wheel for the image's Python (3.11, glibc 2.36: manylinux_2_28 and older).
  platform=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
            --platform any)
  gpuperfd_wheel=$(ls "$CTX"/wheels/gpuperfd-*.whl)
  extra=""
  if [ "$TARGET" != telemetry ]; then
    torch_wheel=$(ls "$TORCH_WHEELS"/torch-"${TORCH#torch==}"*cp311*.whl 2>/dev/null | head -1) \
      || die "no ${TORCH} wheel for cp311 in $TORCH_WHEELS (set TORCH_WHEELS)"
    cp "$torch_wheel" "$CTX/wheels/"
    # Pin the local wheel's exact version (e.g. 2.13.0+cpu) so pip never fetches another build.
    torch_version=$(basename "$torch_wheel" | cut -d- -f2)
    echo "torch==$torch_version" >"$CTX/torch-pin.txt"
    extra="[probes]"
  fi
  "$PYTHON" -m pip download -q -d "$CTX/wheels" "${platform[@]}" --find-links "$CTX/wheels" \
    -c deploy/container/constraints.txt ${extra:+-c "$CTX/torch-pin.txt"} \
    "${gpuperfd_wheel}${extra}" ${extra:+"torch==$torch_version"}
else
  BASE_IMAGE=${BASE_IMAGE:-docker.io/library/python:3.11-slim-bookworm}
  echo "image.sh: mode registry: base $BASE_IMAGE, packages from the index (pip args: '${PIP_ARGS}'), $TORCH"
fi

build() {  # build TARGET NAME
  local t0=$(date +%s) previous
  previous=$("$ENGINE" image inspect --format '{{.Id}}' "$2:$VERSION" 2>/dev/null || true)
  # No layer cache: the wheels change with every commit, so it would rarely hit, and each
  # build would leave GBs of intermediate images behind.
  "$ENGINE" "${ENGINE_ARGS[@]}" build --layers=false --network host --target "$1" -t "$2:$VERSION" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg PIP_ARGS="$PIP_ARGS" --build-arg TORCH="$TORCH" \
    --build-arg GPUPERFD_VERSION="$VERSION" \
    --build-arg VCS_REF="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    --build-arg CREATED="$(date -u -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}" +%Y-%m-%dT%H:%M:%SZ)" \
    -f "$CTX/Containerfile" "$CTX" >"$CTX/build-$1.log" 2>&1 || { tail -30 "$CTX/build-$1.log" >&2; die "build of $1 failed"; }
  local size now
  now=$("$ENGINE" image inspect --format '{{.Id}}' "$2:$VERSION")
  # The image this build replaced, if nothing else uses it.
  [ -n "$previous" ] && [ "$previous" != "$now" ] && "$ENGINE" rmi "$previous" >/dev/null 2>&1 || true
  size=$("$ENGINE" image inspect --format '{{.Size}}' "$2:$VERSION")
  echo "image.sh: built $2:$VERSION ($1) in $(( $(date +%s) - t0 )) s, $(( size / 1000000 )) MB"
}
[ "$TARGET" != probes ] && build telemetry gpuperfd
[ "$TARGET" != telemetry ] && build probes gpuperfd-probes
echo "image.sh: mode $MODE done in $(( $(date +%s) - started )) s"
