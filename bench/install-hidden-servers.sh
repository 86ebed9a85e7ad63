#!/usr/bin/env bash
# Installs the servers bench/hidden_servers.py profiles (issue 34's hidden
# servers) from Debian 12 packages. Kept out of scripts/install-deps.sh on
# purpose: CI never runs this bench and should not download these servers.
# The packages' services are not started: the bench runs its own instances
# on free ports with its own certificates and configuration.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "install-hidden-servers: run as root (apt-get needs it)" >&2
  exit 1
fi

packages=(
  apache2                               # Apache 2.4, event MPM, mod_ssl
  redis-server redis-tools              # Redis 7.0 with TLS, redis-benchmark --tls
  lighttpd lighttpd-mod-openssl         # lighttpd 1.4 with mod_openssl
  caddy                                 # Caddy 2.6, Go 1.19 crypto/tls
  postgresql postgresql-contrib         # Postgres 15 (pgbench is in postgresql-contrib)
  openssl linux-perf procps             # certificates, the perf anchor
)

# Package scripts would start each service through invoke-rc.d; a
# policy-rc.d that answers 101 ("action forbidden") keeps them stopped.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  made_policy=1
fi
trap '[[ $made_policy == 1 ]] && rm -f "$policy"' EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${packages[@]}"
