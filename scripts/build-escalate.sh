#!/usr/bin/env bash
# Builds lazaret-escalate, the Escalation Client, as a statically linked
# binary (glibc's libc.a from libc6-dev, +crt-static) that runs in any image,
# even one without a C library, and checks that it is static: no program
# interpreter, no needed shared libraries. Prints the binary's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi

target=x86_64-unknown-linux-gnu
# A separate target directory: RUSTFLAGS differ from the ordinary build's, and
# sharing one would rebuild everything each time either is built.
target_dir=${CARGO_TARGET_DIR:-$repo/target}/escalate
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
  -p lazaret-protocol --features client --bin lazaret-escalate \
  --target "$target" --target-dir "$target_dir" >&2
bin="$target_dir/$target/release/lazaret-escalate"

fail() { echo "build-escalate: $bin $1" >&2; exit 1; }
[ -x "$bin" ] || fail "was not built"
headers=$(readelf --program-headers --dynamic "$bin") || fail "is not an ELF file readelf can read"
if grep -q 'INTERP' <<<"$headers"; then fail "has a program interpreter: it is not statically linked"; fi
if grep -q '(NEEDED)' <<<"$headers"; then fail "needs shared libraries: $(grep '(NEEDED)' <<<"$headers" | tr -s ' ' | tr '\n' ' ')"; fi
if command -v file >/dev/null 2>&1 && ! file -b "$bin" | grep -q 'static'; then
  fail "is not statically linked according to file: $(file -b "$bin")"
fi
printf '%s\n' "$bin"
