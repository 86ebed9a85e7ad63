#!/usr/bin/env bash
# Makes the Debian 13 (trixie) root that the tests of today's TLS stacks run in as containers (a plain chroot, and
# an own mount namespace after pivot_root): OpenSSL 3.5 with libssl-dev, Go 1.24, nginx 1.26, haproxy 3.0 and
# android-libboringssl 14, with the compiler and headers the ground-truth workloads are built with inside it.
# debootstrap from this machine's own Debian archive (its trixie suite; scripts/debian-archive.sh), then apt inside
# the root. A root whose stamp matches the package list is kept (about 1.1 GB); another is made beside it and
# swapped in whole, so a failed run leaves the old one.
#   scripts/make-trixie-root.sh [DIR]        DIR defaults to /opt/tlsprof-trixie
# scripts/install-deps.sh --tests runs it; tests find the root at $TLSPROF_TRIXIE_ROOT or the default.
set -euo pipefail

root=${1:-/opt/tlsprof-trixie}
layout=1 # bump when what the root holds changes other than by the package list
packages=(
  # today's TLS stacks
  openssl libssl-dev golang-1.24-go nginx haproxy android-libboringssl android-libboringssl-dev
  # the ground-truth workloads are built inside the root, against its libraries and glibc
  g++ make libcli11-dev nlohmann-json3-dev
  # what libcrypto.a links with (its pkg-config Libs.private)
  zlib1g-dev libzstd-dev
  # the test PKI and the scripted client mix
  ca-certificates procps
)

if [[ $(id -u) -ne 0 ]]; then
  echo "make-trixie-root: run as root (debootstrap and chroot need it)" >&2
  exit 1
fi
want=$({
  echo "layout $layout"
  printf '%s\n' "${packages[@]}"
} | sha256sum | cut -d' ' -f1)
if [[ -f $root/.tlsprof-stamp && $(head -n1 "$root/.tlsprof-stamp") == "$want" ]]; then
  exit 0
fi
command -v debootstrap >/dev/null || {
  echo "make-trixie-root: debootstrap is missing (scripts/install-deps.sh installs it)" >&2
  exit 1
}
# shellcheck source=debian-archive.sh
source "$(dirname "$0")/debian-archive.sh"
uri=$(debian_archive_uri)
if [[ -z $uri ]]; then
  echo "make-trixie-root: no Debian archive URI in this machine's apt sources; the trixie root cannot be made" >&2
  exit 1
fi

new=$root.new
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rm -rf "$new"
start=$SECONDS
if ! debootstrap --variant=minbase trixie "$new" "$uri" >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "make-trixie-root: debootstrap of trixie from $uri failed (log above)" >&2
  exit 1
fi
# Name resolution for apt inside, and no service started by a package's postinst (nginx, haproxy): the tests
# start their servers themselves.
cp /etc/resolv.conf "$new/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"
chmod 755 "$new/usr/sbin/policy-rc.d"
# apt runs inside the root with /proc mounted in a private mount namespace, which ends with it.
if ! unshare -m --propagation private sh -c '
    set -e
    mount -t proc proc "$1/proc"
    shift
    chroot "$0" env DEBIAN_FRONTEND=noninteractive apt-get -qq update
    chroot "$0" env DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends "$@"
    chroot "$0" apt-get -qq clean' "$new" "$new" "${packages[@]}" >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "make-trixie-root: installing ${packages[*]} inside the trixie root failed (log above)" >&2
  exit 1
fi
rm -rf "$new"/var/lib/apt/lists/*
# The versions the tests were measured with, after the stamp's first line.
{
  echo "$want"
  chroot "$new" openssl version
  chroot "$new" env GOROOT=/usr/lib/go-1.24 /usr/lib/go-1.24/bin/go version # no /proc here to find GOROOT by
  chroot "$new" nginx -v 2>&1
  chroot "$new" haproxy -v | sed -n 1p # sed reads it all: head would end haproxy by SIGPIPE, failing the pipeline
  chroot "$new" dpkg-query -W -f '${Package} ${Version}\n' android-libboringssl
} >"$new/.tlsprof-stamp"
rm -rf "$root"
mv "$new" "$root"
echo "make-trixie-root: $root in $((SECONDS - start)) s: $(sed -n 2p "$root/.tlsprof-stamp")," \
  "$(sed -n 3p "$root/.tlsprof-stamp")"
