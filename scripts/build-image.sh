#!/usr/bin/env bash
# Builds the default Lazaret image (Debian 12 minbase with git and CA
# certificates) with debootstrap from the Debian archive, once, and caches it
# as a tarball outside the repository. Prints the tarball's path.
set -euo pipefail
cache=${LAZARET_CACHE:-/var/cache/lazaret}
out="$cache/images/bookworm-minbase-git.tar.zst"
if [ -s "$out" ]; then printf '%s\n' "$out"; exit 0; fi
. "$(dirname "$0")/debian-mirror.sh"
mirror=$(debian_mirror)
mkdir -p "$cache/images"
work=$(mktemp -d "$cache/images/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=git,ca-certificates,procps bookworm "$work/rootfs" "$mirror" >&2
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"* 
tar --numeric-owner --xattrs -C "$work/rootfs" -cf - . | zstd -q -T0 -o "$work/image.tar.zst"
mv "$work/image.tar.zst" "$out"
printf '%s\n' "$out"
