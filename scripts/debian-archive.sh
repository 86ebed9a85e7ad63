# Sourced by install-deps.sh and make-trixie-root.sh: the URI of this
# machine's main Debian archive (not the security one), from its apt sources,
# deb822 (sources.list.d/debian.sources) or one-line style. Other suites
# (bullseye's OpenSSL 1.1, the trixie root) come from the same archive.
debian_archive_uri() {
  local f=/etc/apt/sources.list.d/debian.sources
  if [[ -f $f ]]; then
    awk 'tolower($1) == "uris:" && $2 !~ /security/ { print $2; exit }' "$f"
  elif [[ -f /etc/apt/sources.list ]]; then
    awk '$1 == "deb" { uri = ($2 ~ /^\[/) ? $3 : $2; if (uri !~ /security/) { print uri; exit } }' /etc/apt/sources.list
  fi
}
