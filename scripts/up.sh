#!/usr/bin/env bash
# One command: set everything up (scripts/setup.sh), then run the default
# profile in the git checkout you are standing in.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
exec /usr/local/bin/lazaret run "$@"
