#!/bin/sh
# make-cert.sh DIR [rsa|ecdsa]
# Writes DIR/key.pem and DIR/cert.pem: a self-signed certificate for
# 127.0.0.1/localhost with an RSA-2048 (default) or ECDSA P-256 key.
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 DIR [rsa|ecdsa]" >&2
  exit 2
fi
dir=$1
kind=${2:-rsa}
case $kind in
  rsa) keyopt="-newkey rsa:2048" ;;
  ecdsa) keyopt="-newkey ec -pkeyopt ec_paramgen_curve:P-256" ;;
  *) echo "$0: key type must be rsa or ecdsa, not '$kind'" >&2; exit 2 ;;
esac
mkdir -p "$dir"
# shellcheck disable=SC2086 # $keyopt is several words on purpose
openssl req -x509 $keyopt -nodes -sha256 -days 7 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
echo "$dir/cert.pem $dir/key.pem ($kind)"
