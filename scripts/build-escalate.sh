#!/usr/bin/env bash
# Builds the two programs Lazaret binds into every sandbox as statically
# linked binaries (glibc's libc.a from libc6-dev, +crt-static) that run in
# any image, even one without a C library: lazaret-escalate, the Escalation
# Client, and lazaret-session-init, each session's subreaper. Checks that
# both are static: no program interpreter, no needed shared libraries.
# Prints the path of lazaret-escalate, or of the program named as the only
# argument (lazaret-escalate or lazaret-session-init); both are built, side
# by side in one directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi

wanted=${1:-lazaret-escalate}
case "$wanted" in
  lazaret-escalate|lazaret-session-init) ;;
  *) echo "build-escalate: unknown program $wanted (lazaret-escalate or lazaret-session-init)" >&2; exit 2 ;;
esac

target=x86_64-unknown-linux-gnu
# A separate target directory: RUSTFLAGS differ from the ordinary build's, and
# sharing one would rebuild everything each time either is built.
target_dir=${CARGO_TARGET_DIR:-$repo/target}/escalate
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
  -p lazaret-protocol --features client --bin lazaret-escalate --bin lazaret-session-init \
  --target "$target" --target-dir "$target_dir" >&2

for name in lazaret-escalate lazaret-session-init; do
  bin="$target_dir/$target/release/$name"
  fail() { echo "build-escalate: $bin $1" >&2; exit 1; }
  [ -x "$bin" ] || fail "was not built"
  headers=$(readelf --program-headers --dynamic "$bin") || fail "is not an ELF file readelf can read"
  if grep -q 'INTERP' <<<"$headers"; then fail "has a program interpreter: it is not statically linked"; fi
  if grep -q '(NEEDED)' <<<"$headers"; then fail "needs shared libraries: $(grep '(NEEDED)' <<<"$headers" | tr -s ' ' | tr '\n' ' ')"; fi
  if command -v file >/dev/null 2>&1 && ! file -b "$bin" | grep -q 'static'; then
    fail "is not statically linked according to file: $(file -b "$bin")"
  fi
done
printf '%s\n' "$target_dir/$target/release/$wanted"
