#!/usr/bin/env bash
# Installs the runsc that Lazaret supports (Debian 13 "trixie" package, a static
# binary that runs on Debian 12) into /usr/local/bin, without changing this
# machine's own apt sources: a throw-away apt state directory is pointed at the
# trixie suite of the same mirror the machine already uses.
set -euo pipefail

want_min=20240729
dest=${LAZARET_RUNSC_DEST:-/usr/local/bin/runsc}
cache=${LAZARET_CACHE:-/var/cache/lazaret}

runsc_date() { "$1" --version 2>/dev/null | sed -n 's/^runsc version release-\([0-9]\{8\}\).*/\1/p; s/^runsc version 0\.0~\([0-9]\{8\}\).*/\1/p' | head -n1; }

if [ -x "$dest" ]; then
  have=$(runsc_date "$dest" || true)
  if [ -n "$have" ] && [ "$have" -ge "$want_min" ]; then
    echo "runsc $have already at $dest"
    exit 0
  fi
fi

. "$(dirname "$0")/debian-mirror.sh"
mirror=$(debian_mirror)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$cache"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/sources.list"
aptopts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
         -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work" -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
apt-get "${aptopts[@]}" update -qq
( cd "$cache" && apt-get "${aptopts[@]}" download runsc )
deb=$(ls -t "$cache"/runsc_*.deb | head -n1)
dpkg -x "$deb" "$work/root"
install -m 0755 "$work/root/usr/sbin/runsc" "$dest" 2>/dev/null || install -m 0755 "$work/root/usr/bin/runsc" "$dest"
echo "installed $("$dest" --version | head -n1) at $dest"
