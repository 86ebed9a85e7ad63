#!/usr/bin/env bash
# The main job on its embedded default: installs dependencies, builds, then
# profiles this host for ~10 s while the bundled demo TLS workload runs, and
# prints the report. Extra arguments go to `tlsprof-agent demo`
# (e.g. --format json, --duration 20).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
exec "$root/build/bin/tlsprof-agent" demo --duration 10 "$@"
