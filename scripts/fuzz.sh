#!/usr/bin/env bash
# Fuzzing the parsers of untrusted input (docs/fuzzing.md).
#
#   scripts/fuzz.sh smoke                    every target for $FUZZ_SMOKE_SECONDS (20) s from seed
#                                            $FUZZ_SEED (1), so a CI failure replays; fails on a crash
#   scripts/fuzz.sh long [TARGET] [SECONDS]  one target (default: all, in turn) for SECONDS (600) each
#   scripts/fuzz.sh merge TARGET             adds what a long run found to the committed corpus, minimised
#   scripts/fuzz.sh replay TARGET FILE...    runs inputs (a crash artefact) once, with the panic message
#   scripts/fuzz.sh list                     the targets
#
# Stable rustc is enough: without a sanitizer cargo fuzz passes no -Z flag;
# RUSTC_BOOTSTRAP=1 lets stable take the ones a sanitizer run (-s address) needs. Builds go to
# fuzz/target; crashes to fuzz/artifacts/TARGET/. The committed corpora in
# fuzz/corpus/TARGET are only read: new inputs go to fuzz/target/corpus/TARGET.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo/fuzz"

if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi
if ! command -v cargo-fuzz >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo-fuzz" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi
command -v cargo-fuzz >/dev/null 2>&1 || {
  echo "fuzz: cargo-fuzz is missing: cargo install cargo-fuzz --locked (scripts/setup.sh --test-tools installs it)" >&2
  exit 1
}
export RUSTC_BOOTSTRAP=1
# Optimised, with debug assertions and overflow checks; no sanitizer (the
# code under test is safe Rust: ASan would only slow it down).
build_flags=(-O -a --sanitizer none)
# -timeout: an input slower than this is a finding (exponential matching);
# -rss_limit_mb: so is one that makes the target hold this much memory.
fuzz_flags=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

targets() { cargo fuzz list; }
# Where a run keeps the inputs it finds (scripts/fuzz.sh merge reads them).
scratch_root="$repo/fuzz/target/corpus"

# run TARGET SECONDS [LIBFUZZER_FLAG...]: fuzzes TARGET from its committed
# corpus; prints one summary line; returns libFuzzer's status.
run() {
  local target=$1 seconds=$2 log scratch status=0
  shift 2
  scratch="$scratch_root/$target"
  mkdir -p "$scratch" "$repo/fuzz/corpus/$target" "$repo/fuzz/artifacts/$target"
  log=$(mktemp)
  cargo fuzz run "${build_flags[@]}" "$target" "$scratch" "$repo/fuzz/corpus/$target" -- \
    "${fuzz_flags[@]}" -max_total_time="$seconds" "$@" >"$log" 2>&1 || status=$?
  local runs rate
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
  if [ "$status" -eq 0 ]; then
    printf 'fuzz: %-20s ok      %10s runs %8s exec/s  %4s s\n' "$target" "${runs:-?}" "${rate:-?}" "$seconds"
  else
    printf 'fuzz: %-20s FAILED  %10s runs %8s exec/s  (status %s)\n' "$target" "${runs:-?}" "${rate:-?}" "$status"
    # The panic message and the artefact libFuzzer saved.
    grep -E "panicked at|^thread '|Test unit written to|ERROR: libFuzzer|SUMMARY" -A3 "$log" | head -n 40 >&2 || tail -n 40 "$log" >&2
    echo "fuzz: full log: $log; turn the crash into a regression test (docs/fuzzing.md)" >&2
    return "$status"
  fi
  rm -f "$log"
}

cmd=${1:-smoke}
case "$cmd" in
  list) targets ;;
  smoke)
    seconds=${FUZZ_SMOKE_SECONDS:-20}
    # A fixed seed: the same binary and corpus take the same path, so a
    # finding in CI is found again by the same command here (the scratch
    # corpus of earlier runs, fuzz/target/corpus, is left out for that).
    seed=${FUZZ_SEED:-1}
    scratch_root=$(mktemp -d)
    trap 'rm -rf "$scratch_root"' EXIT
    echo "fuzz: building the targets" >&2
    cargo fuzz build "${build_flags[@]}" >&2
    failed=()
    for target in $(targets); do
      run "$target" "$seconds" -seed="$seed" || failed+=("$target")
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz: seed $seed (FUZZ_SEED=$seed FUZZ_SMOKE_SECONDS=$seconds scripts/fuzz.sh smoke runs it again)" >&2
      echo "fuzz: ${#failed[@]} failed, $(( $(targets | wc -l) - ${#failed[@]} )) passed: ${failed[*]}" >&2
      exit 1
    fi
    echo "fuzz: smoke passed for $(targets | wc -l) targets" >&2
    ;;
  long)
    seconds=${3:-600}
    if [ -n "${2:-}" ] && [ "${2:-}" != all ]; then list=$2; else list=$(targets); fi
    status=0
    for target in $list; do run "$target" "$seconds" || status=1; done
    echo "fuzz: new inputs are in fuzz/target/corpus/TARGET; keep them with: scripts/fuzz.sh merge TARGET" >&2
    exit "$status"
    ;;
  merge)
    target=${2:?merge TARGET}
    mkdir -p "$repo/fuzz/target/corpus/$target"
    # -merge=1 adds to the first directory only inputs that add coverage.
    cargo fuzz run "${build_flags[@]}" "$target" "$repo/fuzz/corpus/$target" "$repo/fuzz/target/corpus/$target" -- -merge=1 >&2
    du -sh "$repo/fuzz/corpus/$target" >&2
    ;;
  replay)
    target=${2:?replay TARGET FILE...}
    shift 2
    cargo fuzz run "${build_flags[@]}" "$target" "$@" -- -runs=1
    ;;
  *) echo "fuzz: unknown command $cmd (smoke, long [TARGET] [SECONDS], merge TARGET, replay TARGET FILE..., list)" >&2; exit 2 ;;
esac
