#!/usr/bin/env bash
# One command: set everything up (scripts/setup.sh), then run the default
# profile in the git checkout you are standing in. A new user (no
# configuration yet) gets the one `lazaret init` writes: profiles shell
# (the default), claude, codex, gemini, grok and opencode.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

# The configuration the developer's `lazaret` reads (as setup.sh finds it).
dev_user=${SUDO_USER:-root}
dev_home=$(getent passwd "$dev_user" | cut -d: -f6)
cfg=${LAZARET_CONFIG:-$dev_home/.config/lazaret/config.toml}
new_user=0
[ -e "$cfg" ] || [ -L "$cfg" ] || new_user=1

bash "$here/setup.sh"

# setup.sh writes its minimal default for a new user; replace exactly that
# (never a file the user had or edited) with the full starter configuration.
if [ "$new_user" = 1 ] && cmp -s "$cfg" "$repo/docs/config.default.toml"; then
  rm -f "$cfg"
  /usr/local/bin/lazaret init "$cfg" >&2
fi
exec /usr/local/bin/lazaret run "$@"
