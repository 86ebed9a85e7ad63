#!/bin/sh
# run-load.sh PORT DURATION [WRK_CONNECTIONS] [HANDSHAKE_RATE]
# Drives https://127.0.0.1:PORT/ for DURATION seconds with two loads at once:
#  - wrk on keep-alive connections (bulk record encryption on the server);
#  - handshake-client.js doing full handshakes (signature + key exchange).
# Exits when both are done; non-zero if either failed.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 PORT DURATION [WRK_CONNECTIONS=4] [HANDSHAKE_RATE=0 (unlimited)]" >&2
  exit 2
fi
port=$1
duration=$2
conns=${3:-4}
rate=${4:-0}
here=$(dirname "$0")
command -v wrk >/dev/null || { echo "$0: wrk not found (apt-get install wrk)" >&2; exit 1; }

wrk -t1 -c"$conns" -d"${duration}s" "https://127.0.0.1:$port/" >"${TMPDIR:-/tmp}/run-load-wrk.$$" 2>&1 &
wrk_pid=$!
node "$here/handshake-client.js" --port "$port" --duration "$duration" --concurrency 1 --rate "$rate" &
hs_pid=$!
# Stop both if we are stopped.
trap 'kill "$wrk_pid" "$hs_pid" 2>/dev/null' TERM INT

wait "$wrk_pid"; wrk_rc=$?
wait "$hs_pid"; hs_rc=$?
# wrk's summary: requests and transfer rate.
grep -E 'requests in|Transfer/sec|Socket errors' "${TMPDIR:-/tmp}/run-load-wrk.$$" | sed 's/^/wrk: /'
rm -f "${TMPDIR:-/tmp}/run-load-wrk.$$"
[ "$wrk_rc" -eq 0 ] && [ "$hs_rc" -eq 0 ]
