#!/usr/bin/env bash
# The security suite on every supported configuration (issue 18, OR-4).
#
# A cell is one `cargo test` invocation of the security-sensitive
# end-to-end tests (tests/tests/: filesystem, git_guard, workspace_guard
# when present, network, escalation, terminal, failures, homes, secrets,
# stdio and the escape_* corpus) with one filesystem, one runsc platform and one kind of lab
# network:
#   - filesystem: the tests' temporary directories (/tmp: workspaces,
#     scratch configurations, registries) and the Storage Root (the image
#     store and every Domain Root) on a loop-mounted image of ext4, xfs or
#     btrfs, or on a tmpfs, that this script makes and removes itself. It is
#     mounted in a private mount namespace of the cell only (never in the
#     host's mount table) and bound over /tmp and the tests' Storage Root
#     there; "host" leaves both where they are (the machine's own disk).
#   - platform: `[runsc] platform` of the tests' configurations
#     (LAZARET_TEST_RUNSC_PLATFORM), else runsc's default for Lazaret,
#     systrap.
#   - network: the tests' lab (tests/src/netlab.rs) dual-stack, or with an
#     IPv4-only host (LAZARET_TEST_LAB_IPV6=0).
# Each cell runs with its own parent of the tests' runtime directories
# (LAZARET_TEST_RUNTIME_PARENT), so that anything it leaves behind is found
# by command line, ended by PID and reported as a failure of the cell; its
# loop device and mounts go with it, also when it fails or the run is
# interrupted.
#
# Each run writes a dated record to docs/evidence/ (a Markdown summary and
# a TSV with one line per cell and test: cell, test, result, seconds).
# docs/supported.md says what the cells stand for.
#
#   sudo scripts/matrix.sh                   # every cell, one after another
#   sudo scripts/matrix.sh xfs ext4-ptrace   # some cells
#   scripts/matrix.sh --list                 # the cells
# Options: --no-setup (the caller has set up and built everything, and
# exported LAZARET_TEST_IMAGE_TARBALL and LAZARET_BIN: scripts/test.sh),
# --record-dir DIR (where the record goes; default docs/evidence).
set -euo pipefail
# The whole script is one brace group, parsed before it runs: editing the
# file while a run is under way cannot change what that run does.
{
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cd "$repo"

# name|filesystem|platform|lab IPv6|tests ("all" or a list)|what it is for
CELLS=(
  "default|host|systrap|1|all|the machine as it is: its own disk, runsc's default platform, a dual-stack lab"
  "xfs|xfs|systrap|1|all|workspaces and Storage Root on XFS"
  "btrfs|btrfs|systrap|1|all|workspaces and Storage Root on btrfs"
  "tmpfs|tmpfs|systrap|1|all|workspaces and Storage Root on tmpfs"
  "ext4-ptrace|ext4|ptrace|1|all|the ptrace platform, on an ext4 image"
  "xfs-ptrace|xfs|ptrace|1|filesystem git_guard workspace_guard secrets escape_sentry|the CI cell: ptrace on XFS, the filesystem tests"
  "ipv4-only|host|systrap|0|network|an IPv4-only host: the network policy with no IPv6 on the host"
  "kvm|host|kvm|1|all|the KVM platform, where runsc can start a KVM sandbox"
)
# Every security test file; workspace_guard is picked up once it exists.
SECURITY_TESTS=(filesystem git_guard workspace_guard network escalation terminal failures homes secrets stdio
  escape_fds escape_runsc escape_devices escape_tty escape_root escape_sentry escape_cross_domain)
OPTIONAL_TESTS=" workspace_guard "
# Tests that do not apply to a cell, with the reason (recorded as n/a):
# cell|test|reason
NOT_APPLICABLE=(
  "ipv4-only|network::ipv6_enabled_reaches_public_v6_but_not_ula_host_or_transit|needs IPv6 on the host: an IPv4-only host has none to give the sandbox (ipv6_disabled_lets_nothing_leave_over_it and the IPv4 tests run)"
)
# How long the KVM probe may take to start and end a sandbox.
KVM_PROBE_SECS=20
# Size of each filesystem image (sparse) and of the tmpfs.
FS_SIZE=6G

cell_field() { # CELL N: field N (1-based) of CELL's definition
  local c
  for c in "${CELLS[@]}"; do
    if [ "${c%%|*}" = "$1" ]; then echo "$c" | cut -d'|' -f"$2"; return 0; fi
  done
  return 1
}

# --- inside a cell's private mount namespace --------------------------------
if [ "${1:-}" = "__cell" ]; then
  # __cell FS SOURCE MOUNTPOINT STATUS_FILE -- cargo test ARGS...
  fs=$2 source=$3 mnt=$4 status=$5
  shift 5; [ "$1" = "--" ] && shift
  if [ "$fs" != host ]; then
    if [ "$fs" = tmpfs ]; then
      mount -t tmpfs -o "size=$FS_SIZE,mode=0755" "$source" "$mnt"
    else
      mount "$source" "$mnt"
    fi
    mkdir -m 1777 "$mnt/tmp"
    mkdir -m 0700 "$mnt/storage"
    # A clone under /tmp (the README's commands work from a clone anywhere)
    # must stay where cargo and the tests look for it: it is bound again at
    # its own path inside the cell's /tmp.
    keep=
    case "$repo/" in
      /tmp/*) keep="$mnt/.repo"; mkdir "$keep"; mount --bind "$repo" "$keep" ;;
    esac
    mount --bind "$mnt/tmp" /tmp
    if [ -n "$keep" ]; then
      mkdir -p "$repo"
      mount --move "$keep" "$repo"
    fi
    mkdir -p /var/cache/lazaret/test-storage
    mount --bind "$mnt/storage" /var/cache/lazaret/test-storage
  fi
  # What `lazaret doctor` makes of this cell (it must name the cell's
  # filesystem and platform), from a workspace-like directory on /tmp.
  rtp=$LAZARET_TEST_RUNTIME_PARENT
  mkdir -p -m 0700 "$rtp/doctor"
  cfg="$rtp/doctor.toml"
  printf 'storage_root = "/var/cache/lazaret/test-storage"\nruntime_dir = "%s/doctor"\n\n[runsc]\nplatform = "%s"\n\n[profiles.test]\nimage = "test"\n' "$rtp" "${LAZARET_TEST_RUNSC_PLATFORM:-systrap}" > "$cfg"
  doctor_dir=$(mktemp -d /tmp/lazaret-matrix-doctor.XXXXXX)
  ( cd "$doctor_dir" && "$LAZARET_BIN" --config "$cfg" doctor ) > "$status.doctor" 2>&1 || echo "doctor exited $?" >> "$status.doctor"
  rm -rf "$doctor_dir"
  set +e
  "$@"
  rc=$?
  set -e
  echo "cargo=$rc" > "$status"
  if [ "$fs" != host ]; then
    # Domain Roots and anything else the tests left in the Storage Root.
    left=$(find "$mnt/storage/domains" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    echo "domains_left=$left" >> "$status"
    left_tmp=$(find "$mnt/tmp" -mindepth 1 -maxdepth 1 -name 'lazaret-*' 2>/dev/null | wc -l)
    echo "tmp_left=$left_tmp" >> "$status"
  fi
  exit 0
fi

# --- the run -----------------------------------------------------------------
setup=1
record_dir="$repo/docs/evidence"
want=()
while [ $# -gt 0 ]; do
  case "$1" in
    --list)
      for c in "${CELLS[@]}"; do IFS='|' read -r n f p v t d <<<"$c"; printf '%-12s fs=%-6s platform=%-8s lab=%-10s tests=%s\n             %s\n' "$n" "$f" "$p" "$([ "$v" = 1 ] && echo dual-stack || echo IPv4-only)" "$t" "$d"; done
      exit 0 ;;
    --no-setup) setup=0 ;;
    --record-dir) record_dir=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "matrix: unknown option $1 (--list, --no-setup, --record-dir DIR)" >&2; exit 2 ;;
    *) cell_field "$1" 1 >/dev/null || { echo "matrix: unknown cell $1 (scripts/matrix.sh --list)" >&2; exit 2; }; want+=("$1") ;;
  esac
  shift
done
if [ ${#want[@]} -eq 0 ]; then
  for c in "${CELLS[@]}"; do want+=("${c%%|*}"); done
fi
# A full run has every cell (in any order).
full=$([ "$(printf '%s\n' "${want[@]}" | sort -u | wc -l)" -eq ${#CELLS[@]} ] && echo 1 || echo 0)

[ "$(id -u)" -eq 0 ] || { echo "matrix: needs root (loop devices, mounts, namespaces, runsc): sudo $0" >&2; exit 1; }
if ! command -v cargo >/dev/null 2>&1 && [ -x /root/.cargo/bin/cargo ]; then export PATH="/root/.cargo/bin:$PATH"; fi

if [ "$setup" -eq 1 ]; then
  bash "$here/setup.sh" --deps-only --test-tools
  getent passwd lazaret-test >/dev/null || useradd --system --create-home --shell /usr/sbin/nologin lazaret-test
  export LAZARET_TEST_IMAGE_TARBALL=$(bash "$here/build-image.sh")
  export LAZARET_BIN="$repo/target/debug/lazaret"
  cargo build --locked --workspace --all-targets --features lazaret-protocol/client
  # The static Escalation Client and session subreaper, where the
  # coordinator looks for them (../lib/lazaret of lazaret), as test.sh does.
  install -D -m 0755 "$(bash "$here/build-escalate.sh")" "$repo/target/lib/lazaret/lazaret-escalate"
  install -D -m 0755 "$(bash "$here/build-escalate.sh" lazaret-session-init)" "$repo/target/lib/lazaret/lazaret-session-init"
fi
: "${LAZARET_TEST_IMAGE_TARBALL:?matrix: --no-setup needs LAZARET_TEST_IMAGE_TARBALL (scripts/test.sh exports it)}"
: "${LAZARET_BIN:?matrix: --no-setup needs LAZARET_BIN (scripts/test.sh exports it)}"
for tool in mkfs.ext4 mkfs.xfs mkfs.btrfs losetup unshare setsid runsc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "matrix: $tool missing: scripts/setup.sh --deps-only --test-tools installs it" >&2; exit 1; }
done

# Per-test times: libtest's --report-time, which stable test binaries
# accept when RUSTC_BOOTSTRAP is set in their environment. It is set for the
# test binaries only (through cargo's runner), so nothing is rebuilt; the
# record says "-" where a time is missing.
triple=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUNNER"
export "$runner_var=env RUSTC_BOOTSTRAP=1"

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
stamp=$(date -u +%Y%m%dT%H%MZ)
work=$(mktemp -d /var/tmp/lazaret-matrix.XXXXXX)
# Short: a Domain's coordinator.sock lies three levels below it and a
# socket path has at most 107 bytes.
rt_root="/run/lazaret-matrix/$$"
mkdir -p "$rt_root"
loops=()
cell_pid=
cell_no=0

# PIDs (not ours) whose command line contains $1.
procs_mentioning() {
  local d pid
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
    if { tr '\0' ' ' < "$d/cmdline"; } 2>/dev/null | grep -qF -- "$1"; then echo "$pid"; fi
  done
}

# Ends (SIGKILL, by PID) what a cell left behind; prints what it ended.
reap() {
  local pid
  for pid in $(procs_mentioning "$1"); do
    echo "$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$cell_pid" ] && kill -0 "$cell_pid" 2>/dev/null; then
    kill -TERM -- "-$cell_pid" 2>/dev/null || true
    sleep 2
    kill -KILL -- "-$cell_pid" 2>/dev/null || true
    wait "$cell_pid" 2>/dev/null || true
  fi
  reap "$rt_root" >/dev/null || true
  sleep 0.5
  local l
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  rm -rf "$rt_root" "$work"
  rmdir /run/lazaret-matrix 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tests_of() { # CELL: the test files of CELL that exist; fails on a missing required one
  local list t
  list=$(cell_field "$1" 5)
  [ "$list" = all ] && list="${SECURITY_TESTS[*]}"
  for t in $list; do
    if [ -f "tests/tests/$t.rs" ]; then
      echo "$t"
    elif [[ "$OPTIONAL_TESTS" != *" $t "* ]]; then
      echo "matrix: tests/tests/$t.rs is missing" >&2
      return 1
    fi
  done
}

# Parses a cell's cargo output into "test<TAB>result<TAB>seconds" lines.
parse_results() {
  awk '
    /^ *Running tests\/[A-Za-z0-9_]+\.rs/ { bin = $2; sub(/^tests\//, "", bin); sub(/\.rs$/, "", bin); next }
    /^running [0-9]+ tests?$/ { expected[bin] += $2; next }
    $1 == "test" && $3 == "..." {
      r = $4; t = "-"
      if ($5 ~ /^<[0-9.]+s>$/) { t = $5; gsub(/[<s>]/, "", t) }
      if (r == "ok") r = "pass"; else if (r == "FAILED") r = "FAIL"; else if (r == "ignored") r = "ignored"
      print bin "::" $2 "\t" r "\t" t
      seen[bin]++
      next
    }
    END { for (b in expected) if (seen[b] < expected[b]) print b "::(" expected[b] - seen[b] " tests not reported: the test binary died)\tFAIL\t-" }
  ' "$1"
}

results="$work/results.tsv"   # cell test result seconds
summary="$work/summary.tsv"   # cell fs platform net tests pass fail na seconds status note
: > "$results"; : > "$summary"

machine_line() {
  local cpu mem os
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
  mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
  os=$(. /etc/os-release && echo "$PRETTY_NAME")
  echo "$(nproc) CPUs ($cpu), $mem, $os"
}

write_record() {
  mkdir -p "$record_dir"
  local md="$record_dir/matrix-$stamp.md" tsv="$record_dir/matrix-$stamp.tsv"
  sort -t$'\t' -k1,1 -k2,2 "$results" | { printf 'cell\ttest\tresult\tseconds\n'; cat; } > "$tsv"
  {
    echo "# Security matrix run $started"
    echo
    echo "Written by \`scripts/matrix.sh\` ($([ "$full" -eq 1 ] && echo "full run: every cell" || echo "cells: ${want[*]}")). What the cells stand for: [docs/supported.md](../supported.md). Every test with its result and time: [matrix-$stamp.tsv](matrix-$stamp.tsv) (\`cut -f1-3\` of two records diffs their results)."
    echo
    echo "| | |"
    echo "| --- | --- |"
    echo "| machine | $(machine_line) |"
    echo "| kernel | $(uname -r) |"
    echo "| runsc | $(runsc --version 2>/dev/null | head -n1) |"
    echo "| rustc | $(rustc --version) |"
    echo "| commit | $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo " (uncommitted changes in: $(git diff --name-only HEAD | tr '\n' ' '| sed 's/ $//'))") |"
    echo "| finished | $(date -u +%Y-%m-%dT%H:%M:%SZ) |"
    echo
    echo "| cell | filesystem | platform | lab network | tests | passed | failed | n/a | time | status |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    while IFS=$'\t' read -r c f p n tests pass fail na secs status note; do
      echo "| $c | $f | $p | $n | $tests | $pass | $fail | $na | $(printf '%dm%02ds' $((secs / 60)) $((secs % 60))) | $status${note:+: $note} |"
    done < "$summary"
    echo
    local bad
    bad=$(awk -F'\t' '$3 != "pass" && $3 != "n/a"' "$results")
    if [ -n "$bad" ]; then
      echo "Failed:"
      echo
      echo "$bad" | awk -F'\t' '{ print "- " $1 ": `" $2 "` " $3 }'
      echo
    fi
    local na
    na=$(awk -F'\t' '$3 == "n/a"' "$results")
    if [ -n "$na" ]; then
      echo "Not applicable (not run, with the reason):"
      echo
      for entry in "${NOT_APPLICABLE[@]}"; do
        IFS='|' read -r c t why <<<"$entry"
        grep -q "^$c	$t	n/a" "$results" && echo "- $c: \`$t\`: $why"
      done
      echo
    fi
    echo "Per-test times come from libtest's \`--report-time\` (enabled on the stable toolchain through \`RUSTC_BOOTSTRAP\` in the test binaries' environment only); tests run two at a time (\`--test-threads=2\`) on a shared 2-core machine, so they vary by up to 2x between runs. A cell's time includes importing the test image into its fresh Storage Root."
    echo
    echo "What \`lazaret doctor\` reported in each cell (the lines about the supported configurations):"
    echo
    echo '```'
    cat "$work"/doctor-*.txt 2>/dev/null
    echo '```'
  } > "$md"
  echo "matrix: record written to ${md#"$repo"/} and ${tsv#"$repo"/}" >&2
}

kvm_probe() { # prints why KVM cannot be used, or nothing when a KVM sandbox starts
  [ -e /dev/kvm ] || { echo "no /dev/kvm on this host"; return; }
  local state="$work/kvm-state" pid i
  mkdir -p "$state"
  ( cd "$work" && exec runsc --root "$state" --platform=kvm --network=none --ignore-cgroups do /bin/true ) >/dev/null 2>&1 &
  pid=$!
  for i in $(seq $((KVM_PROBE_SECS * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    reap "$state" >/dev/null
    echo "runsc's KVM platform did not start a sandbox within ${KVM_PROBE_SECS}s (\`runsc --platform=kvm do /bin/true\`; the project's machines are VMs with nested virtualisation, where it hangs)"
  elif ! wait "$pid"; then
    echo "\`runsc --platform=kvm do /bin/true\` failed"
  fi
}

run_cell() {
  local cell=$1 fs platform ipv6 net desc tests t args=() skip=() na=0 rtp start secs log status note
  fs=$(cell_field "$cell" 2); platform=$(cell_field "$cell" 3); ipv6=$(cell_field "$cell" 4); desc=$(cell_field "$cell" 6)
  net=$([ "$ipv6" = 1 ] && echo dual-stack || echo IPv4-only)
  tests=$(tests_of "$cell")
  echo "matrix: cell $cell ($desc): fs=$fs platform=$platform lab=$net tests: $(echo $tests)" >&2
  start=$(date +%s)
  if [ "$platform" = kvm ]; then
    local why
    why=$(kvm_probe)
    if [ -n "$why" ]; then
      echo "matrix: cell $cell UNSUPPORTED: $why" >&2
      printf '%s\t%s\t%s\t%s\t%s\t0\t0\t0\t%s\tunsupported\t%s\n' "$cell" "$fs" "$platform" "$net" "$(echo $tests | wc -w) files" $(($(date +%s) - start)) "$why" >> "$summary"
      return 0
    fi
  fi
  for t in $tests; do args+=(--test "$t"); done
  for entry in "${NOT_APPLICABLE[@]}"; do
    IFS='|' read -r c name why <<<"$entry"
    if [ "$c" = "$cell" ] && echo "$tests" | grep -qx "${name%%::*}"; then
      skip+=(--skip "${name#*::}")
      printf '%s\t%s\tn/a\t-\n' "$cell" "$name" >> "$results"
      na=$((na + 1))
    fi
  done

  cell_no=$((cell_no + 1))
  rtp="$rt_root/$cell_no"
  mkdir -p "$rtp"
  local mnt="$work/$cell.mnt" source=none img
  mkdir -p "$mnt"
  case "$fs" in
    host) ;;
    tmpfs) source="lazaret-matrix-$cell" ;;
    *)
      img="$work/$cell.img"
      truncate -s "$FS_SIZE" "$img"
      case "$fs" in
        ext4) mkfs.ext4 -q -F "$img" ;;
        xfs) mkfs.xfs -q -f "$img" ;;
        btrfs) mkfs.btrfs -q -f "$img" >/dev/null ;;
      esac
      source=$(losetup --find --show "$img")
      loops+=("$source")
      ;;
  esac
  log="$work/$cell.log"
  status="$work/$cell.status"
  : > "$log"
  # Its own session and process group (ended as one if the run is
  # interrupted) and its own mount namespace (its mounts go with it).
  (
    export LAZARET_TEST_RUNTIME_PARENT="$rtp"
    if [ "$ipv6" = 0 ]; then export LAZARET_TEST_LAB_IPV6=0; else unset LAZARET_TEST_LAB_IPV6; fi
    if [ "$platform" = systrap ]; then unset LAZARET_TEST_RUNSC_PLATFORM; else export LAZARET_TEST_RUNSC_PLATFORM="$platform"; fi
    exec setsid unshare --mount --propagation private -- bash "$here/matrix.sh" __cell "$fs" "$source" "$mnt" "$status" -- \
      cargo test --locked --workspace --features lazaret-protocol/client --no-fail-fast "${args[@]}" -- \
      --test-threads=2 -Z unstable-options --report-time "${skip[@]}"
  ) > "$log" 2>&1 < /dev/null &
  cell_pid=$!
  # The cell's output as it comes (tail ends with the cell).
  tail -n +1 -f --pid="$cell_pid" "$log" &
  local tail_pid=$!
  wait "$cell_pid" || true
  # Anything still in the cell's process group (a lab's namespace holders
  # and servers outlive a test binary that died) is left behind.
  local group_left
  group_left=$(pgrep -g "$cell_pid" -a 2>/dev/null | cut -c1-120 || true)
  if [ -n "$group_left" ]; then kill -KILL -- "-$cell_pid" 2>/dev/null || true; fi
  cell_pid=
  wait "$tail_pid" || true
  secs=$(($(date +%s) - start))

  status_text=$(cat "$status" 2>/dev/null || echo "cargo=none")
  note=""
  local cargo_rc
  cargo_rc=$(echo "$status_text" | sed -n 's/^cargo=//p')
  parse_results "$log" | sed "s/^/$cell\t/" >> "$results"
  local left
  left=$(reap "$rtp")
  if [ -n "$group_left" ]; then left="${left:+$left
}$group_left"; fi
  if [ -n "$left" ]; then
    note="${note:+$note; }processes left behind: $(echo "$left" | wc -l) ($(echo "$left" | head -n3 | cut -c1-120 | tr '\n' ';'))"
  fi
  for key in domains_left tmp_left; do
    local n
    n=$(echo "$status_text" | sed -n "s/^$key=//p")
    if [ -n "$n" ] && [ "$n" != 0 ]; then note="${note:+$note; }$key=$n"; fi
  done
  if [ "$source" != none ] && [ "$fs" != tmpfs ]; then
    losetup -d "$source" 2>/dev/null || true
    sleep 0.2
    if losetup -a | grep -q "$work/$cell.img"; then note="${note:+$note; }loop device $source still attached (a process holds the cell's filesystem)"; fi
    loops=("${loops[@]/$source}")
  fi
  if grep -q "$work" /proc/self/mountinfo; then note="${note:+$note; }the cell's mounts are in the host's mount table"; fi
  # doctor must see the cell's configuration.
  local doc="$work/$cell.status.doctor" want_fs="$fs"
  [ "$fs" = host ] && want_fs=$(stat -f -c %T /tmp | sed 's/^ext2\/ext3$/ext4/')
  {
    echo "[$cell]"
    awk '/^(OK|WARN|FAIL) / { keep = ($0 ~ /^(OK|WARN|FAIL) +(kernel|runsc release|platform|host network|workspace fs|storage root fs):/) }
         keep && (/^(OK|WARN|FAIL) / || /^ +why:/)' "$doc" 2>/dev/null
    [ -s "$doc" ] || echo "(no doctor output)"
  } > "$work/doctor-$cell.txt"
  grep -qE "^OK +workspace fs: $want_fs " "$doc" 2>/dev/null || note="${note:+$note; }doctor does not report the workspace on $want_fs"
  grep -qE "^OK +storage root fs: $want_fs " "$doc" 2>/dev/null || note="${note:+$note; }doctor does not report the Storage Root on $want_fs"
  grep -qE "^(OK|WARN) +platform: $platform " "$doc" 2>/dev/null || note="${note:+$note; }doctor does not report platform $platform"
  if grep -q '^FAIL' "$doc" 2>/dev/null; then note="${note:+$note; }doctor: $(grep '^FAIL' "$doc" | head -n2 | tr '\n' ';')"; fi

  local pass fail total
  pass=$(awk -F'\t' -v c="$cell" '$1 == c && $3 == "pass"' "$results" | wc -l)
  fail=$(awk -F'\t' -v c="$cell" '$1 == c && $3 != "pass" && $3 != "n/a"' "$results" | wc -l)
  total=$((pass + fail + na))
  if [ "$cargo_rc" = 0 ] && [ "$fail" -eq 0 ] && [ -z "$note" ] && [ "$pass" -gt 0 ]; then
    status=pass
  else
    status=FAIL
    [ "$cargo_rc" = 0 ] || [ "$fail" -gt 0 ] || note="${note:+$note; }cargo test exited ${cargo_rc:-?}"
    [ "$pass" -gt 0 ] || note="${note:+$note; }no test passed"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cell" "$fs" "$platform" "$net" "$total" "$pass" "$fail" "$na" "$secs" "$status" "$note" >> "$summary"
  echo "matrix: cell $cell: $status ($pass passed, $fail failed, $na n/a, ${secs}s)${note:+: $note}" >&2
  if [ -f "$work/$cell.img" ]; then
    echo "matrix: cell $cell: its $fs image took $(du -m "$work/$cell.img" | cut -f1) MiB of $work's disk (of $FS_SIZE)" >&2
  fi
  rm -rf "$rtp" "$mnt" "$work/$cell.img"
}

for cell in "${want[@]}"; do
  run_cell "$cell"
  write_record
done

echo >&2
column -t -s$'\t' "$summary" >&2 || cat "$summary" >&2
! awk -F'\t' '$10 == "FAIL"' "$summary" | grep -q .
exit
}
