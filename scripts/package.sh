#!/usr/bin/env bash
# Builds the Debian packages tlsprof-agent and tlsprof-collector (CPack, see
# packaging/CMakeLists.txt) into build/packages/, after building the two
# binaries they hold. Usage: scripts/package.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build}")
if [[ ! -f $build/CPackConfig.cmake ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTLSPROF_WERROR="${TLSPROF_WERROR:-OFF}" >/dev/null
fi
cmake --build "$build" --target tlsprof-agent tlsprof-collector
rm -f "$build"/packages/*.deb
# dpkg-shlibdeps (Depends) and strip run on copies under packages/_CPack_Packages.
(cd "$build" && cpack -G DEB -B "$build/packages" --config CPackConfig.cmake >/dev/null)
rm -rf "$build/packages/_CPack_Packages"
for deb in "$build"/packages/*.deb; do
  printf '%s\t%s bytes\t%s\n' "$deb" "$(stat -c %s "$deb")" "$(dpkg-deb -f "$deb" Depends)"
done
