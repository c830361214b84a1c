#!/usr/bin/env bash
# Builds release binaries and runs a benchmark, printing its table.
# Usage: sudo scripts/bench.sh run [RUNS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$here")"
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi
bash "$here/setup.sh" --deps-only
cargo build --locked --release -p lazaret-cli -p lazaret-tests
export LAZARET_BIN="$PWD/target/release/lazaret"
exec target/release/lazaret-bench "${@:-run}"
