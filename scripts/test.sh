#!/usr/bin/env bash
# One command: set up what the tests need, then run the whole suite (style:
# rustfmt and clippy; unit tests, privileged end-to-end tests in tests/, and
# the TLA+ check).
# Expensive artefacts (the debootstrapped test rootfs, the runsc package) are
# cached in /var/cache/lazaret, outside the repository.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"

[ "$(id -u)" -eq 0 ] || { echo "test: the suite needs root (namespaces, mounts, runsc): sudo $0" >&2; exit 1; }
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi

# Disk: a clean clone's run takes about 7 GB (measured 2026-12-03: target/
# 4.6 GB, fuzz/target 1.7 GB, the test image cache 0.4 GB, the XFS cell's
# image 0.3 GB). A disk that fills part-way fails later stages with
# ENOSPC in places that name neither the cause nor the fix: refuse at once.
need_mb=8192
have_mb=$(df --output=avail -BM "$repo" | tail -n1 | tr -dc 0-9)
built_mb=$({ du -sm "$repo/target" "$repo/fuzz/target" 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
if [ $((have_mb + built_mb)) -lt "$need_mb" ]; then
  echo "test: not enough free disk: the suite needs about $((need_mb / 1024)) GiB for $repo (build outputs included; $((built_mb)) MiB already built), $have_mb MiB free on $(df --output=target "$repo" | tail -n1). Free some space (e.g. cargo clean in other checkouts) and run again." >&2
  exit 1
fi

bash "$here/setup.sh" --deps-only --test-tools

# A non-root developer for the ownership tests.
if ! getent passwd lazaret-test >/dev/null; then
  useradd --system --create-home --shell /usr/sbin/nologin lazaret-test
fi

export LAZARET_TEST_IMAGE_TARBALL=$(bash "$here/build-image.sh")
export LAZARET_BIN="$repo/target/debug/lazaret"

# The Escalation Client's tests need its feature (the workspace build
# leaves the client out otherwise).
cargo build --locked --workspace --all-targets --features lazaret-protocol/client
# The static Escalation Client in ../lib/lazaret/ of the lazaret the tests
# run (the coordinator binds it into every sandbox from there; cargo's own
# build of the client beside lazaret is dynamically linked).
export LAZARET_ESCALATE_STATIC_BIN=$(bash "$here/build-escalate.sh")
install -D -m 0755 "$LAZARET_ESCALATE_STATIC_BIN" "$repo/target/lib/lazaret/lazaret-escalate"
install -D -m 0755 "$(dirname "$LAZARET_ESCALATE_STATIC_BIN")/lazaret-session-init" "$repo/target/lib/lazaret/lazaret-session-init"
# Every stage runs even when one before it failed (and cargo test runs
# every test binary), so one CI run reports every failure; the status says
# whether any did.
failed=()
# Style first: formatting (rustfmt.toml) and every clippy warning, the
# workspace lints included (undocumented unsafe blocks are errors).
cargo fmt --all -- --check >&2 || failed+=("cargo fmt --check (run: cargo fmt --all)")
cargo clippy --locked --workspace --all-targets --features lazaret-protocol/client -- -D warnings || failed+=("cargo clippy")
cargo test --locked --no-fail-fast --workspace --features lazaret-protocol/client -- --test-threads=2 || failed+=("cargo test")
# Every fuzz target briefly (docs/fuzzing.md; `scripts/fuzz.sh long` for real runs).
FUZZ_SMOKE_SECONDS=${FUZZ_SMOKE_SECONDS:-10} bash "$here/fuzz.sh" smoke || failed+=("fuzz smoke")
# One non-default cell of the security matrix (docs/supported.md): the
# filesystem tests on runsc's ptrace platform, with the workspaces and the
# Storage Root on an XFS image. Its record goes to target/matrix/.
bash "$here/matrix.sh" --no-setup --record-dir "$repo/target/matrix" xfs-ptrace || failed+=("matrix xfs-ptrace")
if [ -x protocol/check-tla.sh ]; then
  bash protocol/check-tla.sh || failed+=("TLA+ check")
fi
if [ ${#failed[@]} -gt 0 ]; then
  printf 'test: FAILED: %s\n' "${failed[*]}" >&2
  exit 1
fi
echo "test: every stage passed" >&2
