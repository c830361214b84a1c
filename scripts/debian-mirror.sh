# Sourced by the other scripts: prints the Debian mirror this machine's apt
# already uses (first non-security URI), so no host name is written down here.
debian_mirror() {
  local m=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    m=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  [ -n "$m" ] || { echo "cannot find the Debian mirror in /etc/apt/sources.list*" >&2; return 1; }
  printf '%s\n' "$m"
}
