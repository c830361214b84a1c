"""Static checks of Lazaret.tla and Lazaret.cfg without TLC.

TLC and SANY (tla2tools.jar) are not available from the package registries
this project can reach, so CI checks the specification with the parsers that
are: tree-sitter-tlaplus (the grammar of the official TLA+ VS Code extension)
and the `tla` package (a Python TLA+ parser). On top of syntax it checks that
every identifier used is defined somewhere in the module or in a standard
module it EXTENDS, and that every name the .cfg mentions is defined.

Usage: python tla_lint.py Lazaret.tla Lazaret.cfg   (exit 1 on any problem)
"""

import re
import sys

import tla
import tree_sitter
import tree_sitter_tlaplus

# Operators of the standard modules Lazaret EXTENDS (Naturals, FiniteSets,
# Sequences, TLC) and the module names themselves.
STANDARD = {
    "Naturals", "FiniteSets", "Sequences", "TLC",
    "Nat", "IsFiniteSet", "Cardinality", "Seq", "Len", "Append", "Head",
    "Tail", "SubSeq", "SelectSeq", "Print", "PrintT", "Assert", "JavaTime",
    "ToString", "Permutations", "SortSeq", "RandomElement", "Any",
}


def fail(problems):
    for problem in problems:
        print(f"tla_lint: {problem}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        fail(["usage: tla_lint.py MODULE.tla MODULE.cfg"])
    tla_path, cfg_path = sys.argv[1], sys.argv[2]
    source = open(tla_path, "rb").read()
    problems = []

    # 1. tree-sitter: no error or missing nodes.
    language = tree_sitter.Language(tree_sitter_tlaplus.language())
    tree = tree_sitter.Parser(language).parse(source)
    defined, used = set(), []

    def walk(node):
        if node.is_error or node.is_missing:
            line, column = node.start_point
            problems.append(
                f"{tla_path}:{line + 1}:{column + 1}: syntax error near "
                f"{source[node.start_byte:node.end_byte][:40]!r}"
            )
        text = source[node.start_byte:node.end_byte].decode()
        if node.type == "identifier":
            defined.add(text)
        elif node.type == "identifier_ref":
            used.append((text, node.start_point))
        for child in node.children:
            walk(child)

    walk(tree.root_node)
    if tree.root_node.type != "source_file" or not tree.root_node.children:
        problems.append(f"{tla_path}: tree-sitter found no module")

    # 2. The `tla` parser must accept the module as well.
    try:
        module = tla.parse(source.decode())
    except Exception as error:  # the parser raises assorted exception types
        module = None
        problems.append(f"{tla_path}: tla parser: {error}")
    if module is None and not problems:
        problems.append(f"{tla_path}: tla parser rejected the module")

    # 3. Every identifier used is defined (module definitions, parameters,
    #    bound variables, constants, variables) or standard.
    for name, (line, column) in used:
        if name not in defined and name not in STANDARD:
            problems.append(f"{tla_path}:{line + 1}:{column + 1}: undefined identifier {name}")

    # 4. Every name in the configuration is defined in the module.
    cfg = open(cfg_path).read()
    cfg = re.sub(r"\\\*.*", "", cfg)
    for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", cfg):
        keywords = {"CONSTANTS", "CONSTANT", "SPECIFICATION", "INVARIANTS", "INVARIANT",
                    "PROPERTIES", "PROPERTY", "CHECK_DEADLOCK", "FALSE", "TRUE",
                    "INIT", "NEXT", "SYMMETRY", "CONSTRAINT", "CONSTRAINTS"}
        if token not in keywords and token not in defined:
            problems.append(f"{cfg_path}: {token} is not defined in {tla_path}")

    if problems:
        fail(problems)
    print(f"tla_lint: {tla_path} and {cfg_path}: syntax, identifiers and "
          f"configuration names OK ({len(defined)} names defined, {len(used)} uses)")


if __name__ == "__main__":
    main()
