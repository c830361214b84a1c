#!/usr/bin/env bash
# One command: set up what the tests need, then run the whole suite (unit
# tests, privileged end-to-end tests in tests/, and the TLA+ check).
# Expensive artefacts (the debootstrapped test rootfs, the runsc package) are
# cached in /var/cache/lazaret, outside the repository.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"

[ "$(id -u)" -eq 0 ] || { echo "test: the suite needs root (namespaces, mounts, runsc): sudo $0" >&2; exit 1; }
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi

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
