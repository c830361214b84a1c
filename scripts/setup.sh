#!/usr/bin/env bash
# Sets up everything Lazaret needs on a Debian 12 machine, as root:
# Debian packages, the supported runsc, a release build of `lazaret` in
# /usr/local/bin, the default image (built once with debootstrap, cached in
# /var/cache/lazaret) imported into the store, and a default configuration for
# the developer if none exists. Safe to run again: each step is skipped when
# already done.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
deps_only=0
test_tools=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=1 ;;
    --test-tools) test_tools=1 ;;
    *) echo "setup: unknown argument $arg (--deps-only, --test-tools)" >&2; exit 2 ;;
  esac
done

[ "$(id -u)" -eq 0 ] || { echo "setup: run as root (sudo $0)" >&2; exit 1; }

# Rust: the toolchain must be 1.85+ (edition 2024). A rustup toolchain is
# used when present; otherwise Debian 12's cargo-web/rustc-web (a current
# toolchain Debian ships for its browsers) is installed: Debian 12's own
# `rustc` package (1.63) is too old.
for d in "${SUDO_USER:+$(getent passwd "$SUDO_USER" | cut -d: -f6)/.cargo/bin}" /root/.cargo/bin; do
  if [ -n "$d" ] && [ -x "$d/cargo" ] && ! command -v cargo >/dev/null 2>&1; then export PATH="$d:$PATH"; fi
done
rust_ok() {
  command -v rustc >/dev/null 2>&1 || return 1
  local v; v=$(rustc --version | awk '{print $2}')
  [ "$(printf '%s\n1.85.0\n' "$v" | sort -V | head -n1)" = "1.85.0" ]
}
if ! rust_ok; then
  echo "setup: installing Debian's cargo-web and rustc-web (Rust >= 1.85)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo-web rustc-web >&2
  hash -r
fi
rust_ok || { echo "setup: no Rust >= 1.85 found or installable (install one with rustup)" >&2; exit 1; }

need=()
packages=(debootstrap zstd git pkg-config ca-certificates gcc libc6-dev iproute2 util-linux)
# The test suite also needs a registry, skopeo, htpasswd and openssl (issue
# 7's tests) and Python's venv (the TLA+ parsers of protocol/check-tla.sh).
# busybox-static makes the escalation tests' image that has no libc at all.
# xfsprogs and btrfs-progs make the filesystem images of scripts/matrix.sh;
# the fault tests (tests/tests/faults.rs) remove a Domain's nftables table
# with nft and fill a small ext4 image (e2fsprogs).
[ "$test_tools" -eq 1 ] && packages+=(docker-registry skopeo apache2-utils openssl python3 python3-venv busybox-static xfsprogs btrfs-progs nftables e2fsprogs)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi
if [ "$test_tools" -eq 1 ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  # Debian's package starts a registry on every interface; the tests run
  # their own on 127.0.0.1, so the packaged service stays off.
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# The style checks of scripts/test.sh need rustfmt and clippy: a rustup
# toolchain usually has both; Debian's cargo-web has them as packages of
# their own.
if [ "$test_tools" -eq 1 ]; then
  style=()
  cargo fmt --version >/dev/null 2>&1 || style+=(rustfmt-web)
  cargo clippy --version >/dev/null 2>&1 || style+=(rust-web-clippy)
  if [ ${#style[@]} -gt 0 ]; then
    if command -v rustup >/dev/null 2>&1; then
      echo "setup: this rustup toolchain lacks ${style[*]}: run 'rustup component add rustfmt clippy'" >&2
      exit 1
    fi
    echo "setup: installing ${style[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${style[@]}" >&2
  fi
fi

# The fuzz smoke (scripts/fuzz.sh) needs cargo-fuzz, from crates.io, into
# ~/.cargo/bin (kept there for later runs).
if [ "$test_tools" -eq 1 ] && ! command -v cargo-fuzz >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo-fuzz" ]; then
  echo "setup: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked --version 0.13.2 >&2
fi

bash "$here/install-runsc.sh" >&2

tarball=$(bash "$here/build-image.sh")
if [ "$deps_only" -eq 1 ]; then
  echo "setup: dependencies ready" >&2
  exit 0
fi

echo "setup: building lazaret (release)" >&2
( cd "$repo" && cargo build --locked --release -p lazaret-cli >&2 )
escalate=$(bash "$here/build-escalate.sh")
install -m 0755 "$repo/target/release/lazaret" /usr/local/bin/lazaret
# The Escalation Client is bound into every sandbox from ../lib/lazaret/.
install -D -m 0755 "$escalate" /usr/local/lib/lazaret/lazaret-escalate
# So is each session's subreaper, built beside it.
install -D -m 0755 "$(dirname "$escalate")/lazaret-session-init" /usr/local/lib/lazaret/lazaret-session-init

# Shell completions and the man page, generated from the command's own
# definition (`lazaret completions SHELL`, `lazaret man`).
install_generated() { # DEST ARGS...: lazaret ARGS written to DEST, mode 0644
  local dest=$1 tmp; shift
  tmp=$(mktemp)
  /usr/local/bin/lazaret "$@" >"$tmp"
  install -D -m 0644 "$tmp" "$dest"
  rm -f "$tmp"
}
install_generated /usr/share/bash-completion/completions/lazaret completions bash
install_generated /usr/share/zsh/vendor-completions/_lazaret completions zsh
install_generated /usr/share/fish/vendor_completions.d/lazaret.fish completions fish
install_generated /usr/local/share/man/man1/lazaret.1 man
command -v mandb >/dev/null 2>&1 && mandb -q >/dev/null 2>&1 || true

# The developer: the user who called sudo, else root.
dev_user=${SUDO_USER:-root}
dev_home=$(getent passwd "$dev_user" | cut -d: -f6)
cfg=${LAZARET_CONFIG:-$dev_home/.config/lazaret/config.toml}
if [ ! -e "$cfg" ]; then
  echo "setup: writing a default configuration to $cfg" >&2
  case "$cfg" in
    "$dev_home"/*)
      # In the developer's home, as the developer: a missing ~/.config made
      # by root would stay root's and break their other programs (seen:
      # `lazaret init` could not create ~/.config/opencode).
      runuser -u "$dev_user" -- mkdir -p -m 0755 "$(dirname "$cfg")"
      runuser -u "$dev_user" -- install -m 0644 /dev/stdin "$cfg" <"$repo/docs/config.default.toml" ;;
    *)
      # Elsewhere (LAZARET_CONFIG=/etc/...): root's, like any system file.
      install -d -m 0755 "$(dirname "$cfg")"
      install -m 0644 "$repo/docs/config.default.toml" "$cfg" ;;
  esac
fi

if ! LAZARET_CONFIG="$cfg" lazaret image ls | awk 'NR>1 {print $1}' | grep -qx debian-bookworm; then
  echo "setup: importing the default image" >&2
  LAZARET_CONFIG="$cfg" lazaret image import debian-bookworm "$tarball" >&2
fi
echo "setup: done" >&2
