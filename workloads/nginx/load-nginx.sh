#!/bin/sh
# load-nginx.sh PORT DURATION [WRK_CONNECTIONS=4] [HANDSHAKE_RATE=0]
# Load for run-nginx.sh: wrk on keep-alive connections (bulk AES-GCM records
# of 16 KiB responses) plus node/handshake-client.js doing one full handshake
# per request (no keep-alive, no session reuse). The same pair node/run-load.sh
# runs, since both clients are generic HTTPS clients; returns when both are
# done, non-zero if either failed.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 PORT DURATION [WRK_CONNECTIONS=4] [HANDSHAKE_RATE=0 (unlimited)]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../node/run-load.sh" "$@"
