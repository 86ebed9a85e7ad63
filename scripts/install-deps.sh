#!/usr/bin/env bash
# Installs every build, test and runtime dependency of tlsprof from Debian 12
# packages, with Debian 11's OpenSSL 1.1 unpacked into /opt/tlsprof-openssl-1.1
# and bookworm-backports' Go 1.21-1.23 into /opt/tlsprof-go-backports (below). The README's commands and .ci/run both call this script; nothing is
# fetched from anywhere but the Debian archive.
# The Debian 13 root the tests of today's TLS stacks run in is made by scripts/make-trixie-root.sh, which
# scripts/test.sh runs beside the build; the demo does not need it.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi

packages=(
  # build
  build-essential cmake ninja-build pkg-config clang llvm
  # clang's ASan, UBSan and libFuzzer runtimes (the sanitizer and fuzz passes): only recommended by clang-14
  libclang-rt-14-dev
  libbpf-dev bpftool libelf-dev zlib1g-dev libdw-dev libdebuginfod-dev binutils elfutils
  # x86-64 disassembly: the RET instructions of Go functions (usage probes, never uretprobes on Go)
  libcapstone-dev
  libssl-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  prometheus-cpp-dev libcivetweb-dev
  # Prometheus remote write: snappy-compressed protobuf over HTTP POST
  libsnappy-dev libcurl4-openssl-dev
  # TLS libraries and servers profiled by the tests
  openssl android-libboringssl-dev golang-go nodejs nginx libnginx-mod-stream wrk debuginfod
  # bench/ anchors and tools
  linux-perf python3 procps curl
  # fleet pipeline tests: a real Prometheus server (and promtool), raw gRPC clients for bad input
  prometheus python3-grpcio python3-protobuf
  # remote write's receivers beside Prometheus: VictoriaMetrics (not started as a service: tests run their own)
  victoria-metrics
  # dashboards, rules, packaging and the status page: manifest/rules parsing, the status page's
  # charting library (Chart.js, embedded in the collector at build time), a headless browser test
  python3-yaml libjs-chart.js chromium fonts-dejavu-core
  # .deb packages (CPack's DEB generator runs dpkg-shlibdeps) and their install test (setpriv, adduser)
  dpkg-dev util-linux adduser
  # least privilege: the agent and the collector drop capabilities with libcap (cap_set_proc, cap_drop_bound)
  libcap-dev
  # systemd's notify protocol (sd_notify: READY=1, the watchdog's pings), and a real systemd to test it under
  # (systemd-nspawn --boot; tests/integration/systemd_container.py)
  libsystemd-dev systemd-container
  # fault tests: an agent whose clock is skewed (LD_PRELOAD libfaketime); the collector's journal on a disk that
  # stalls (mkfs.ext4 on a loop device, fsfreeze), fills up (a small tmpfs) or is damaged (test_collector.py)
  faketime e2fsprogs mount util-linux
  # the Debian 13 root of today's TLS stacks (scripts/make-trixie-root.sh), and the base of the images
  debootstrap
  # the Kubernetes images built and run (tests/integration/test_image.py): podman builds them itself (no buildah
  # needed); runc because crun 1.8 refuses cgroup v1 hosts whose cgroup2 mount holds a controller ("hybrid mode")
  podman runc
  # function extents for the function-length check (scripts/function-lengths.py)
  universal-ctags
)

# Packages of other Debian suites, from the same archive as this machine's
# own sources, unpacked into private roots (never installed with dpkg, so the
# system sees nothing of them):
# - OpenSSL 1.1, which Debian 12 no longer ships: Debian 11's libssl1.1 and
#   openssl (bullseye). The usage tests of OpenSSL 1.1 run its `openssl` with
#   LD_LIBRARY_PATH=$openssl11/usr/lib/x86_64-linux-gnu.
# - Go 1.21, 1.22 and 1.23 (bookworm-backports): the Go releases between
#   Debian 12's 1.19 and Debian 13's 1.24, whose crypto/tls layouts the usage
#   probes are checked on (test_usage_go_versions.py, GOROOT=$gobp/usr/lib/go-1.2x).
openssl11=/opt/tlsprof-openssl-1.1
openssl11_packages=(libssl1.1 "openssl=1.1.1*")
gobp=/opt/tlsprof-go-backports
gobp_versions=(1.21 1.22 1.23)
gobp_packages=()
for v in "${gobp_versions[@]}"; do gobp_packages+=("golang-$v-go" "golang-$v-src"); done

# debian_archive_uri
source "$(dirname "$0")/debian-archive.sh"

# install_private ROOT SUITE CHECK PACKAGE...: the packages of SUITE unpacked
# into ROOT, unless ROOT's stamp says it holds them and ROOT/CHECK exists.
install_private() {
  local root=$1 suite=$2 check=$3
  shift 3
  local want_stamp
  want_stamp=$(printf '%s\n' "$suite" "$@" | sha256sum | cut -d' ' -f1)
  if [[ -f $root/.stamp && $(head -n1 "$root/.stamp") == "$want_stamp" && -e $root/$check ]]; then
    return 0
  fi
  local uri
  uri=$(debian_archive_uri)
  if [[ -z $uri ]]; then
    echo "install-deps: no Debian archive URI in /etc/apt/sources.list.d/debian.sources or" \
      "/etc/apt/sources.list; $* ($suite) cannot be fetched into $root" >&2
    return 1
  fi
  local tmp
  tmp=$(mktemp -d)
  # A private apt state (sources, lists, cache): the system's apt sees nothing of $suite.
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs" "$tmp/root"
  echo "deb $uri $suite main" >"$tmp/sources.list"
  local apt=(apt-get -qq -o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o APT::Sandbox::User=root)
  if ! "${apt[@]}" update || ! (cd "$tmp/debs" && "${apt[@]}" download "$@"); then
    rm -rf "$tmp"
    echo "install-deps: downloading $* ($suite) from $uri into $root failed" >&2
    return 1
  fi
  local deb
  for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
  rm -rf "$root"
  mkdir -p "$root"
  cp -a "$tmp/root/." "$root/"
  { echo "$want_stamp"; (cd "$tmp/debs" && ls ./*.deb); } >"$root/.stamp"
  rm -rf "$tmp"
}

install_private_roots() {
  install_private "$openssl11" bullseye usr/lib/x86_64-linux-gnu/libssl.so.1.1 "${openssl11_packages[@]}" || return 1
  LD_LIBRARY_PATH="$openssl11/usr/lib/x86_64-linux-gnu" "$openssl11/usr/bin/openssl" version >/dev/null || return 1
  install_private "$gobp" bookworm-backports "usr/lib/go-${gobp_versions[-1]}/bin/go" "${gobp_packages[@]}" || return 1
  local v
  for v in "${gobp_versions[@]}"; do
    GOROOT="$gobp/usr/lib/go-$v" GOTOOLCHAIN=local GOTELEMETRY=off "$gobp/usr/lib/go-$v/bin/go" version >/dev/null || return 1
  done
}

# npm, for the dashboards' type check (tests/dashboards/test_grafana_schema.py runs `npm ci`). Debian 12's nodejs does
# not bring it (its own package `npm`), while a NodeSource nodejs bundles npm and conflicts with Debian's package: so
# Debian's npm only where no npm came with nodejs.
ensure_npm() {
  command -v npm >/dev/null 2>&1 && return 0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  command -v npm >/dev/null 2>&1 || { echo "install-deps: npm is still missing after apt-get install npm" >&2; return 1; }
}

stamp=/var/lib/tlsprof-deps.stamp
want=$(printf '%s\n' "${packages[@]}" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  ensure_npm
  install_private_roots
  exit
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
# nginx, debuginfod and prometheus are started by the tests themselves, never as system services.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now nginx debuginfod prometheus >/dev/null 2>&1 || true
fi
ensure_npm
echo "$want" >"$stamp"
install_private_roots
