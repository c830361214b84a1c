#!/usr/bin/env bash
# Soak test (issue 17; not in CI): one long-lived Domain (a holder session
# keeps it up) serves sessions and escalations in a loop for MINUTES
# (default 60), and the coordinator's memory (VmRSS from /proc) is printed
# over time as a table, with its threads and open descriptors: a leak shows
# as a column that keeps growing.
#
# Usage: sudo scripts/soak.sh [MINUTES] [SAMPLE_SECONDS]
#
# Each round: a session (`echo`), a session running `lazaret-escalate --
# true`, and a session making 20 escalation round trips from one process
# (`lazaret-escprobe requests 20 -- true`). Everything runs in a network
# namespace of its own (unshare --net), the Domain in a runtime directory and
# workspace of its own, on the shared test image store; all of it is removed
# at the end, also on Ctrl-C.
#
# Needs what the end-to-end tests need (scripts/test.sh sets it up): runsc,
# the test image (LAZARET_TEST_IMAGE_TARBALL, imported once), LAZARET_BIN
# (default target/debug/lazaret) with lazaret-escalate and
# lazaret-session-init in ../lib/lazaret/, lazaret-escprobe next to it
# (`cargo build -p lazaret-tests`) and the user lazaret-test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
die() { echo "soak: $*" >&2; exit 1; }

if [ "${1:-}" != --inner ]; then
  [ "$(id -u)" -eq 0 ] || die "needs root (namespaces, mounts, runsc): sudo $0 $*"
  command -v unshare >/dev/null || die "unshare missing (util-linux)"
  exec unshare --net -- bash "$0" --inner "$@"
fi
shift
minutes=${1:-60}
sample=${2:-$(( minutes * 60 / 30 > 10 ? minutes * 60 / 30 : 10 ))}
case "$minutes$sample" in *[!0-9]*) die "usage: $0 [MINUTES] [SAMPLE_SECONDS]" ;; esac

LAZARET_BIN=${LAZARET_BIN:-$repo/target/debug/lazaret}
[ -x "$LAZARET_BIN" ] || die "lazaret missing at $LAZARET_BIN: cargo build -p lazaret-cli (or set LAZARET_BIN)"
lib=$(dirname "$(dirname "$LAZARET_BIN")")/lib/lazaret
[ -x "$lib/lazaret-escalate" ] || die "$lib/lazaret-escalate missing: install -D -m0755 \"\$(bash scripts/build-escalate.sh)\" $lib/lazaret-escalate"
probe=${LAZARET_ESCPROBE:-$(dirname "$LAZARET_BIN")/lazaret-escprobe}
[ -x "$probe" ] || die "lazaret-escprobe missing at $probe: cargo build -p lazaret-tests (or set LAZARET_ESCPROBE)"
tarball=${LAZARET_TEST_IMAGE_TARBALL:-/var/cache/lazaret/images/bookworm-minbase-git.tar.zst}
id lazaret-test >/dev/null 2>&1 || die "user lazaret-test missing: scripts/test.sh creates it"
command -v runsc >/dev/null || die "runsc missing: scripts/install-runsc.sh"

storage=/var/cache/lazaret/test-storage
work=$(mktemp -d /tmp/lazaret-soak.XXXXXX)
runtime=/run/lazaret-soak-$$
chmod 0755 "$work"
cleanup() {
  set +e
  exec 3>&- 2>/dev/null
  "$LAZARET_BIN" --config "$work/config.toml" stop --all --grace 1 >/dev/null 2>&1
  # Processes of this soak (their command lines name its runtime
  # directory), by PID.
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -qF "$runtime"; then kill -9 "${p#/proc/}" 2>/dev/null; fi
  done
  for d in "$runtime"/*/; do
    [ -d "$d" ] && rm -rf "$storage/domains/$(basename "$d")"
  done
  rm -rf "$runtime" "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The test image, imported once per machine (as the tests do).
mkdir -p /var/cache/lazaret
printf 'storage_root = "%s"\n[profiles.test]\nimage = "test"\n' "$storage" > /var/cache/lazaret/test-storage.toml
(
  flock 9
  if ! "$LAZARET_BIN" --config /var/cache/lazaret/test-storage.toml image ls | awk 'NR > 1 { print $1 }' | grep -qx test; then
    [ -f "$tarball" ] || die "test image $tarball missing: scripts/build-image.sh"
    "$LAZARET_BIN" --config /var/cache/lazaret/test-storage.toml image import test "$tarball" >/dev/null
  fi
) 9>/var/cache/lazaret/test-storage.lock

ws=$work/ws
mkdir -p "$ws"
git -C "$ws" init -q -b main
echo soak > "$ws/README"
git -C "$ws" add README
git -C "$ws" -c user.name=soak -c user.email=soak@example.invalid commit -qm init
cp "$probe" "$ws/.escprobe"
chown -R lazaret-test: "$ws"
cat > "$work/config.toml" <<EOF
storage_root = "$storage"
runtime_dir = "$runtime"

[profiles.test]
image = "test"
user = "root"
command = ["/bin/sh"]

[[escalation.rules]]
name = "true"
command = ["true"]
allow_extra_args = false
EOF
export SUDO_UID=$(id -u lazaret-test) SUDO_GID=$(id -g lazaret-test) SUDO_USER=lazaret-test
lz() { (cd "$ws" && "$LAZARET_BIN" --config "$work/config.toml" "$@"); }

# The holder keeps the Domain (and its coordinator) up throughout.
mkfifo "$work/hold"
lz run test -- sh -c 'echo up; read x' < "$work/hold" > "$work/holder.out" 2>&1 &
holder=$!
exec 3>"$work/hold"
for _ in $(seq 600); do grep -qx up "$work/holder.out" 2>/dev/null && break; sleep 0.1; done
grep -qx up "$work/holder.out" || die "the holder session did not start: $(cat "$work/holder.out")"

# The coordinator proper: of the three processes running `__coordinator`
# for this runtime directory (outer, PID 1 of its namespace, coordinator),
# the one whose parent is one of them and whose children are not.
coordinator_pids() {
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -qF "__coordinator" || continue
    tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -qF "$runtime" || continue
    echo "${p#/proc/}"
  done
}
status_kib() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null; }
row() {
  local pids rss=0 total=0 threads=0 fds=0 p r
  pids=$(coordinator_pids)
  for p in $pids; do
    r=$(status_kib "$p" VmRSS); r=${r:-0}
    total=$((total + r))
    if [ "$r" -gt "$rss" ]; then
      rss=$r; threads=$(status_kib "$p" Threads); fds=$(ls "/proc/$p/fd" 2>/dev/null | wc -l)
    fi
  done
  printf '%8.1f %9d %11d %8d %14d %16d %8d %6d\n' "$(awk -v s=$(( $(date +%s) - start )) 'BEGIN { print s / 60 }')" "$sessions" "$escalations" "$failures" "$rss" "$total" "$threads" "$fds"
}

start=$(date +%s)
end=$((start + minutes * 60))
sessions=0 escalations=0 failures=0
next=$start
echo "soak: $minutes min, a row every $sample s; coordinator = the largest of its $(coordinator_pids | wc -w) processes"
printf '%8s %9s %11s %8s %14s %16s %8s %6s\n' minutes sessions escalations failures "coord RSS KiB" "all 3 RSS KiB" threads fds
first_rss=
while :; do
  now=$(date +%s)
  if [ "$now" -ge "$next" ]; then
    line=$(row); echo "$line"
    [ -n "$first_rss" ] || first_rss=$(echo "$line" | awk '{ print $5 }')
    next=$((next + sample))
  fi
  [ "$now" -lt "$end" ] || break
  [ "$(lz run test -- sh -c 'echo hi' 2>>"$work/errors")" = hi ] || failures=$((failures + 1))
  lz run test -- lazaret-escalate -- true 2>>"$work/errors" || failures=$((failures + 1))
  out=$(lz run test -- "$ws/.escprobe" requests 20 -- true 2>>"$work/errors") || failures=$((failures + 1))
  failures=$((failures + $(echo "$out" | grep -c '^failed' || true)))
  sessions=$((sessions + 3))
  escalations=$((escalations + 1 + $(echo "$out" | grep -c '^[0-9]' || true)))
done
last=$(row); echo "$last"
echo >&3; exec 3>&-
wait "$holder" || failures=$((failures + 1))
echo "soak: $sessions sessions, $escalations escalations, $failures failures in $minutes min; coordinator RSS $first_rss KiB at the start, $(echo "$last" | awk '{ print $5 }') KiB at the end"
if [ -s "$work/errors" ]; then
  echo "soak: stderr of failed rounds (first 20 lines):"
  head -n 20 "$work/errors"
fi
[ "$failures" -eq 0 ]
