#!/bin/sh
# run-nginx.sh DIR PORT [rsa|ecdsa|dual]
# Runs Debian's /usr/sbin/nginx (OpenSSL 3 via the stripped libssl.so.3 and
# libcrypto.so.3) on https://127.0.0.1:PORT/ with everything it writes kept
# in DIR: nginx.conf, cert, pid file, error log, temp dirs, the 16 KiB
# response file and DIR/ready. Two workers, TLS 1.2 and 1.3, keep-alive on,
# no session cache or tickets (every new connection is a full handshake).
# `dual` serves an RSA and an ECDSA certificate (the client's signature
# algorithms pick one). NGINX_SESSION_TICKETS=on turns session tickets on.
# NGINX_WORKERS sets worker_processes (default 2). NGINX_HANDSHAKE_PORT=P
# adds a handshake-only TLS server on 127.0.0.1:P (the stream module,
# libnginx-mod-stream): it answers each connection's handshake with one
# byte ("x") and closes, for handshake-only load (bench/usage_handshake_cost.py).
#
# The script execs nginx (daemon off), so its PID is the nginx master's:
# `kill -TERM PID` stops master and workers. DIR/ready (content: PORT) is
# written atomically once nginx answers an HTTPS request. Nothing is left
# outside DIR; remove DIR afterwards.
set -eu
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 DIR PORT [rsa|ecdsa|dual]" >&2
  exit 2
fi
dir=$1
port=$2
kind=${3:-rsa}
here=$(cd "$(dirname "$0")" && pwd)
nginx=${NGINX:-/usr/sbin/nginx}
[ -x "$nginx" ] || { echo "$0: $nginx not found (apt-get install nginx-light or nginx)" >&2; exit 1; }
command -v curl >/dev/null || { echo "$0: curl not found (used for the readiness check)" >&2; exit 1; }
case $port in
  '' | *[!0-9]* | 0) echo "$0: PORT must be a port number (nginx cannot report a port 0 pick)" >&2; exit 2 ;;
esac

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir/ready" "$dir/ready.tmp"
tickets=${NGINX_SESSION_TICKETS:-off}
workers=${NGINX_WORKERS:-2}
case $workers in '' | *[!0-9]* | 0) echo "$0: NGINX_WORKERS must be a positive number" >&2; exit 2 ;; esac
stream_module=""
stream_block=""
if [ -n "${NGINX_HANDSHAKE_PORT:-}" ]; then
  case $NGINX_HANDSHAKE_PORT in
    *[!0-9]* | 0) echo "$0: NGINX_HANDSHAKE_PORT must be a port number" >&2; exit 2 ;;
  esac
  module=/usr/lib/nginx/modules/ngx_stream_module.so
  [ -f "$module" ] || { echo "$0: $module not found (apt-get install libnginx-mod-stream)" >&2; exit 1; }
  stream_module="load_module $module;"
  stream_block="stream {
  server {
    listen 127.0.0.1:$NGINX_HANDSHAKE_PORT ssl;
    CERTS
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache off;
    ssl_session_tickets $tickets;
    return x;
  }
}"
fi
case $tickets in on | off) ;; *) echo "$0: NGINX_SESSION_TICKETS must be on or off" >&2; exit 2 ;; esac
if [ "$kind" = dual ]; then
  "$here/../node/make-cert.sh" "$dir/rsa" rsa >/dev/null
  "$here/../node/make-cert.sh" "$dir/ecdsa" ecdsa >/dev/null
  certs="ssl_certificate $dir/rsa/cert.pem; ssl_certificate_key $dir/rsa/key.pem;
    ssl_certificate $dir/ecdsa/cert.pem; ssl_certificate_key $dir/ecdsa/key.pem;"
else
  "$here/../node/make-cert.sh" "$dir" "$kind" >/dev/null
  certs="ssl_certificate $dir/cert.pem; ssl_certificate_key $dir/key.pem;"
fi
mkdir -p "$dir/www" "$dir/tmp"
# The fixed 16 KiB response (a static file: `return 200 "..."` cannot hold
# 16 KiB, nginx's config tokens are limited to 4 KiB).
head -c 16384 /dev/zero | tr '\0' 'x' >"$dir/www/index.html"

# As root, nginx's workers would switch to `nobody`, which may not be able
# to enter DIR (mktemp -d makes it 0700); keep them root. The directive is
# only valid (and only needed) for a root master.
user_line=""
[ "$(id -u)" -eq 0 ] && user_line="user root root;"

stream_block=$(printf '%s\n' "$stream_block" | while IFS= read -r line; do
  case $line in *CERTS*) printf '    %s\n' "$certs" ;; *) printf '%s\n' "$line" ;; esac
done)
cat >"$dir/nginx.conf" <<CONF
# Written by workloads/nginx/run-nginx.sh; all paths inside $dir.
$stream_module
$user_line
daemon off;
master_process on;
worker_processes $workers;
pid $dir/nginx.pid;
lock_file $dir/nginx.lock;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  keepalive_timeout 65;
  keepalive_requests 1000000;
  sendfile off;  # the body goes through SSL_write either way; keep the path simple
  server {
    listen 127.0.0.1:$port ssl;
    $certs
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache off;
    ssl_session_tickets $tickets;
    root $dir/www;
    location / { index index.html; }
  }
}
$stream_block
CONF

# Readiness: a background poller writes DIR/ready once an HTTPS request
# succeeds. It outlives the exec below as nginx's child and gives up after
# 20 s (nginx failed to start; its error is on stderr and in error.log).
(
  i=0
  while [ $i -lt 200 ]; do
    if curl -ksf --max-time 1 -o /dev/null "https://127.0.0.1:$port/"; then
      echo "$port" >"$dir/ready.tmp" && mv "$dir/ready.tmp" "$dir/ready"
      exit 0
    fi
    sleep 0.1
    i=$((i + 1))
  done
  exit 0
) &
exec "$nginx" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf"
