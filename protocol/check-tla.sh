#!/usr/bin/env bash
# Keeps protocol/Lazaret.tla honest in CI.
#
# What runs:
#   1. Always: the TLA+ parsers that the reachable package registries serve
#      (PyPI: tree-sitter-tlaplus, the grammar of the official TLA+ VS Code
#      extension, and `tla`, a Python TLA+ parser), plus protocol/tools/tla_lint.py:
#      syntax, undefined identifiers, and names in Lazaret.cfg.
#   2. TLC, only when a tla2tools.jar is supplied (TLA2TOOLS_JAR=/path/to/jar or
#      /var/cache/lazaret/tla2tools.jar): TLC and SANY ship only in that jar, which
#      crates.io, PyPI, npm and Debian do not serve (org.lamport:tla2tools is not
#      on the Maven mirror either; the PyPI wrappers download it from GitHub at
#      run time, which this network forbids).
#      With --require-tlc the script fails when TLC cannot run.
#
# The Python tools are installed once into /var/cache/lazaret/tla-venv.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${LAZARET_CACHE:-/var/cache/lazaret}"
venv="$cache/tla-venv"
require_tlc=0
for arg in "$@"; do
    case "$arg" in
        --require-tlc) require_tlc=1 ;;
        *) echo "check-tla.sh: unknown argument $arg (only --require-tlc)" >&2; exit 2 ;;
    esac
done

packages=(tla==0.0.4 parstools==0.0.5 tree-sitter==0.26.1 tree-sitter-tlaplus==1.5.0)

if ! "$venv/bin/python" -c 'import tla, tree_sitter, tree_sitter_tlaplus' 2>/dev/null; then
    echo "check-tla.sh: installing TLA+ parsers into $venv"
    mkdir -p "$cache"
    if ! python3 -m venv "$venv"; then
        echo "check-tla.sh: cannot create a Python venv (install Debian's python3-venv)" >&2
        exit 1
    fi
    if ! "$venv/bin/pip" install --quiet "${packages[@]}"; then
        echo "check-tla.sh: cannot install ${packages[*]} from PyPI" >&2
        exit 1
    fi
fi

echo "check-tla.sh: parsing $here/Lazaret.tla"
"$venv/bin/python" -W ignore "$here/tools/tla_lint.py" "$here/Lazaret.tla" "$here/Lazaret.cfg"

jar="${TLA2TOOLS_JAR:-$cache/tla2tools.jar}"
if [[ -f "$jar" ]]; then
    if ! command -v java >/dev/null; then
        echo "check-tla.sh: $jar found but no java on PATH" >&2
        exit 1
    fi
    meta="$(mktemp -d)"
    trap 'rm -rf "$meta"' EXIT
    echo "check-tla.sh: running TLC ($jar) on Lazaret.cfg"
    (cd "$here" && java -XX:+UseParallelGC -cp "$jar" tlc2.TLC -metadir "$meta" \
        -workers auto -config Lazaret.cfg Lazaret.tla)
    echo "check-tla.sh: TLC found no error"
elif [[ "$require_tlc" == 1 ]]; then
    echo "check-tla.sh: TLC cannot run: no tla2tools.jar at $jar, and none of crates.io," \
         "PyPI, npm or Debian serves one. Supply it with TLA2TOOLS_JAR=/path/to/tla2tools.jar." >&2
    exit 1
else
    echo "check-tla.sh: TLC not run: tla2tools.jar is not available from the reachable" \
         "registries (set TLA2TOOLS_JAR to run it). The Rust checker (cargo test -p" \
         "lazaret-protocol) explores the same model exhaustively."
fi
