#!/usr/bin/env bash
# make-test-pki.sh DIR [AGENT_NAME[=HOST,...]...]: a throw-away PKI for tests and demos
# (docs/certificates.md explains how to issue real ones).
#
#   DIR/ca.crt, ca.key                     the test CA (EC P-256)
#   DIR/collector.crt, collector.key       CN=tlsprof-collector, SAN DNS:localhost, IP:127.0.0.1
#   DIR/<name>.crt, <name>.key             one agent per AGENT_NAME (CN=<name>, SAN DNS:<name> and DNS:<host>
#                                          for each HOST); default: agent-1. The collector takes a report only
#                                          for a host its certificate names (docs/fleet.md, "Identity"): give
#                                          an agent that reports this machine's hostname `agent-1=$(hostname)`.
#   DIR/expired.crt, expired.key           CN=expired-agent, signed by the CA, valid 2020-01-01..2020-01-02
#   DIR/other-ca.crt, other-ca.key         a second, unrelated CA
#   DIR/wrong-ca.crt, wrong-ca.key         CN=agent-1, signed by the other CA
#
# Not for production: the keys are unencrypted and the CA key sits beside them.
set -euo pipefail
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 DIR [AGENT_NAME[=HOST,...]...]" >&2
  exit 2
fi
dir=$1
shift
agents=("$@")
[[ ${#agents[@]} -gt 0 ]] || agents=(agent-1)
mkdir -p "$dir"
cd "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

make_ca() {  # name subject
  newkey "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "$2" -days 3650 -sha256 -out "$1.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

issue() {  # name CN ca extensions-file-content
  local name=$1 cn=$2 ca=$3 ext=$4
  newkey "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$work/$name.csr"
  printf '%s\n' "$ext" > "$work/$name.ext"
  openssl x509 -req -in "$work/$name.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -days 825 -sha256 \
    -extfile "$work/$name.ext" -out "$name.crt" 2>/dev/null
}

server_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
client_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

make_ca ca "/CN=tlsprof test CA"
issue collector tlsprof-collector ca "$server_ext"
for spec in "${agents[@]}"; do
  name=${spec%%=*}
  san="DNS:$name"
  if [[ $spec == *=* ]]; then
    IFS=, read -ra hosts <<<"${spec#*=}"
    for host in "${hosts[@]}"; do san+=",DNS:$host"; done
  fi
  issue "$name" "$name" ca "$client_ext
subjectAltName=$san"
done

# Expired: `openssl x509` (3.0) cannot back-date, `openssl ca` can.
mkdir -p "$work/ca/new"
: > "$work/ca/index.txt"
echo 1000 > "$work/ca/serial"
cat > "$work/ca.cnf" <<CNF
[ca]
default_ca = test
[test]
dir = $work/ca
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir/new
certificate = $PWD/ca.crt
private_key = $PWD/ca.key
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = client
[any]
commonName = supplied
[client]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
CNF
newkey expired.key
openssl req -new -key expired.key -subj "/CN=expired-agent" -out "$work/expired.csr"
openssl ca -batch -config "$work/ca.cnf" -in "$work/expired.csr" -out expired.crt -notext \
  -startdate 20200101000000Z -enddate 20200102000000Z 2>/dev/null

make_ca other-ca "/CN=some other CA"
issue wrong-ca agent-1 other-ca "$client_ext"
rm -f ./*.srl
echo "test PKI in $PWD: ca, collector, ${agents[*]%%=*}, expired, other-ca, wrong-ca"
