#!/usr/bin/env bash
# Installs every build, test and runtime dependency of tlsprof from Debian 12
# packages. The README's commands and .ci/run both call this script; nothing is
# fetched from anywhere but the Debian archive.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi

packages=(
  # build
  build-essential cmake ninja-build pkg-config clang llvm
  libbpf-dev bpftool libelf-dev zlib1g-dev libdw-dev libdebuginfod-dev binutils elfutils
  # x86-64 disassembly: the RET instructions of Go functions (usage probes, never uretprobes on Go)
  libcapstone-dev
  libssl-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  prometheus-cpp-dev libcivetweb-dev
  # TLS libraries and servers profiled by the tests
  openssl android-libboringssl-dev golang-go nodejs nginx libnginx-mod-stream wrk debuginfod
  # bench/ anchors and tools
  linux-perf python3 procps curl
  # fleet pipeline tests: a real Prometheus server (and promtool), raw gRPC clients for bad input
  prometheus python3-grpcio python3-protobuf
  # dashboards, rules, packaging and the status page: manifest/rules parsing, the status page's
  # charting library (Chart.js, embedded in the collector at build time), a headless browser test
  python3-yaml libjs-chart.js chromium fonts-dejavu-core
  # .deb packages (CPack's DEB generator runs dpkg-shlibdeps) and their install test (setpriv, adduser)
  dpkg-dev util-linux adduser
  # least privilege: the agent and the collector drop capabilities with libcap (cap_set_proc, cap_drop_bound)
  libcap-dev
  # fault tests: an agent whose clock is skewed (LD_PRELOAD libfaketime)
  faketime
)

stamp=/var/lib/tlsprof-deps.stamp
want=$(printf '%s\n' "${packages[@]}" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
# nginx, debuginfod and prometheus are started by the tests themselves, never as system services.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now nginx debuginfod prometheus >/dev/null 2>&1 || true
fi
echo "$want" >"$stamp"
