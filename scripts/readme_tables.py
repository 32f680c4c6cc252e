"""Recopy the README's result tables from the workflow tables they name: `python scripts/readme_tables.py [--check]`.

A README table is tied to the first `figures/<run>/<name>.md` (relative to the README) named in the text before it
(tests/test_readme.py checks the same tie). Each README row keeps its place and its columns and takes the values of
the source row with the same key: the fewest leading README columns that identify a source row. Rows whose key the
source lacks are reported and the file is left as it was. Run it after `snakemake figures`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURE_REF = re.compile(r"figures/[\w.-]+/[\w.-]+\.md")


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().split("|")[1:-1]]


def blocks(lines: list[str]) -> list[tuple[int, int]]:
    """[start, end) line ranges of the Markdown tables in `lines`."""
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|"):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            found.append((start, i))
        else:
            i += 1
    return found


def tables(lines: list[str]) -> list[tuple[str, int, int]]:
    """(the text since the previous table, start, end) for each Markdown table in `lines`."""
    found, last = [], 0
    for start, end in blocks(lines):
        found.append(("\n".join(lines[last:start]), start, end))
        last = end
    return found


def first_table(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = path.read_text().splitlines()
    start, end = blocks(lines)[0]
    return cells(lines[start]), [cells(line) for line in lines[start + 2 : end]]


def render(header: list[str], separator: list[str], rows: list[list[str]]) -> list[str]:
    """A padded Markdown table; alignment markers (leading / trailing ':') kept from `separator`."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = [s.endswith(":") and not s.startswith(":") for s in separator]

    def line(values: list[str]) -> str:
        padded = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        ("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1)) for w, r in zip(widths, right, strict=True)
    )
    return [line(header), rule + "|", *(line(r) for r in rows)]


def recopy(shown: list[str], source: Path) -> tuple[list[str], list[str]]:
    """(new table lines, problems) for the README table `shown` from the source table."""
    header, separator, rows = cells(shown[0]), cells(shown[1]), [cells(line) for line in shown[2:]]
    source_header, source_rows = first_table(source)
    missing = [name for name in header if name not in source_header]
    if missing:
        return shown, [f"{source}: no columns {missing}"]
    index = [source_header.index(name) for name in header]
    projected = [[row[i] for i in index] for row in source_rows]
    for k in range(1, len(header) + 1):
        keys = [tuple(row[:k]) for row in projected]
        if len(set(keys)) == len(keys):
            break
    else:
        return shown, [f"{source}: the README's columns do not identify its rows"]
    by_key = {tuple(row[:k]): row for row in projected}
    problems = [f"{source}: no row {row[:k]}" for row in rows if tuple(row[:k]) not in by_key]
    if problems:
        return shown, problems
    return render(header, separator, [by_key[tuple(row[:k])] for row in rows]), []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the Markdown file to update")
    parser.add_argument("--check", action="store_true", help="report stale tables and exit 1 instead of writing")
    args = parser.parse_args(argv)
    lines = args.readme.read_text().splitlines()
    out, last, stale, problems = [], 0, [], []
    for prose, start, end in tables(lines):
        refs = FIGURE_REF.findall(prose)
        out.extend(lines[last:start])
        table = lines[start:end]
        if refs:
            new, issues = recopy(table, args.readme.parent / refs[0])
            problems += issues
            if [cells(x) for x in new[:1] + new[2:]] != [cells(x) for x in table[:1] + table[2:]]:
                stale.append(refs[0])
                table = new
        out.extend(table)
        last = end
    out.extend(lines[last:])
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 2
    if args.check:
        print("stale: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    args.readme.write_text("\n".join(out) + "\n")
    print(f"recopied {len(stale)} table(s): {', '.join(stale) or 'none changed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
