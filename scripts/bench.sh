#!/usr/bin/env bash
# Builds release binaries and runs benchmarks, each printing a table.
# Usage: sudo scripts/bench.sh [run|net|net-filter|git|escalate|guard|guard-engine|gate|mounts|model|journal|all] [ARG]
#   run [RUNS]    lazaret run test -- true vs bare runsc run vs podman
#                 --runtime runsc (issues 2, 16), interleaved round by round:
#                 cold, teardown tail, back to back, joining; then one cold
#                 run stage by stage from its journal and coordinator log.
#                 Installs podman from Debian's archive if it is missing
#                 (for this bench only; nothing else uses it)
#   net [RUNS]    sidecar topology build/teardown, TCP latency/throughput (issue 3),
#                 a name to first byte with open vs locked egress (issue 15),
#                 then net-filter
#   net-filter [ROUNDS]  the sidecar's nftables filter on bulk TCP: no filter
#                 (bench-only) vs as installed vs locked egress, interleaved (issue 15)
#   git [FILES]   git status in a FILES-file repository, host vs sandbox (issue 4)
#   escalate [N]  round trip of a rule-approved `true` through lazaret-escalate,
#                 N times (default 1000), median and p99 against /bin/true on
#                 the host; then 8 sessions x 100 concurrent requests: none
#                 lost, none duplicated (issue 12)
#   guard [FILES] [ROUNDS]  the Workspace Guard's cost (issue 13): FILES files
#                 (default 20000) unpacked with tar inside the workspace, then
#                 git status inside, guard on vs off (test hook), for a developer
#                 and a root agent; Domain start on vs off and the guard's own
#                 start time (targets: <= 5 %, <= 10 ms)
#   guard-engine [FILES] [ROUNDS] [developer|root]  the guard engine alone, no
#                 sandbox: tar unpacks FILES files into a watched directory
#                 (under target/), guard off and on; the guard thread's CPU,
#                 tar's time, the final sweep
#   gate [FILES] [ROUNDS]  what the Workspace Guard's gate (issue 30) costs
#                 the host's own processes: the real guard and gate over a bind
#                 in the bench's private mount namespace (under target/); git
#                 status and grep -r inside the workspace (all files, files
#                 changed in the run) and outside it (first and second pass,
#                 the gate's ignore marks), gate off and on
#   mounts        mount assembly time for 10/100/1000 ignored paths (issue 4)
#   model         protocol model state counts and times (issue 6)
#   journal [SIZES]  the journal machine's cost per entry as a Domain's
#                 history grows to SIZES requests (default 1000 10000 50000;
#                 issue 17)
# Network benchmarks run entirely inside namespaces they create.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$here")"
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi
bash "$here/setup.sh" --deps-only
cargo build --locked --release -p lazaret-cli -p lazaret-tests
export LAZARET_BIN="$PWD/target/release/lazaret"
install_escalate() {
  # The statically linked Escalation Client, in ../lib/lazaret/ of the lazaret under test.
  install -D -m 0755 "$(bash "$here/build-escalate.sh")" target/lib/lazaret/lazaret-escalate
  install -D -m 0755 "$(bash "$here/build-escalate.sh" lazaret-session-init)" target/lib/lazaret/lazaret-session-init
}
what=${1:-all}
shift || true
install_podman() {
  # The `run` bench's podman baseline; Debian's podman (4.3 on bookworm).
  command -v podman >/dev/null 2>&1 && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends podman >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y --no-install-recommends podman >/dev/null; } \
    || echo "bench: podman could not be installed; its row will say so" >&2
}
case "$what" in
  # Every session starts under lazaret-session-init: run and git install
  # this tree's build of it (target/lib/lazaret is shared with debug builds).
  run) install_escalate; install_podman; target/release/lazaret-bench run "$@" ;;
  git) install_escalate; target/release/lazaret-bench git "$@" ;;
  net) target/release/lazaret-bench net "$@" ;;
  net-filter) target/release/lazaret-bench net-filter "$@" ;;
  guard) install_escalate; target/release/lazaret-bench guard "$@" ;;
  escalate) install_escalate; target/release/lazaret-bench escalate "$@" ;;
  guard-engine) (cd target && cargo run --locked --release -q -p lazaret-mounts --example guard_bench -- "$@") ;;
  gate) (cd target && cargo run --locked --release -q -p lazaret-mounts --example gate_bench -- "$@") ;;
  mounts) cargo run --locked --release -q -p lazaret-mounts --example assembly_bench ;;
  model) cargo run --locked --release -q -p lazaret-protocol --example check_model -- user ;;
  journal) cargo run --locked --release -q -p lazaret-protocol --example journal_apply -- "$@" ;;
  all)
    install_escalate
    install_podman
    target/release/lazaret-bench run; echo
    target/release/lazaret-bench net; echo
    target/release/lazaret-bench git; echo
    target/release/lazaret-bench escalate; echo
    target/release/lazaret-bench guard; echo
    cargo run --locked --release -q -p lazaret-mounts --example assembly_bench; echo
    cargo run --locked --release -q -p lazaret-protocol --example check_model -- user; echo
    cargo run --locked --release -q -p lazaret-protocol --example journal_apply ;;
  *) echo "usage: $0 [run|net|net-filter|git|escalate|guard|guard-engine|gate|mounts|model|journal|all] [ARG]" >&2; exit 2 ;;
esac
