"""The README's result tables are copies of the workflow's: every row it shows must be a row of the file it names.

A README table is tied to the first `figures/<run>/<name>.md` named in the text between it and the table before it
(tables that name none, like the layout or the H200 kernel table, are not generated and not checked). The README may
show fewer rows or columns than the file and may pad cells differently; every cell it shows must equal the file's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_recopy_script():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "scripts" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = load_recopy_script()  # the README tie and table parsing are the recopy script's, so both agree
FIGURE_REF = SCRIPT.FIGURE_REF


def split_tables(text: str) -> list[tuple[str, list[str]]]:
    """(text before the table, the table's lines) for each Markdown table, in order."""
    lines = text.splitlines()
    return [(prose, lines[start:end]) for prose, start, end in SCRIPT.tables(lines)]


def parse_table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header cells and data rows (the separator row dropped) of one Markdown table."""
    rows = [SCRIPT.cells(line) for line in lines]
    if len(rows) < 2 or not all(set(cell) <= set(":- ") for cell in rows[1]):
        raise ValueError(f"not a Markdown table (no separator row): {lines[:2]}")
    return rows[0], rows[2:]


def unmatched_rows(shown: list[str], source: list[str]) -> list[str]:
    """The rows of the table `shown` (lines) that are not rows of `source` (lines) on the columns `shown` has."""
    header, rows = parse_table(shown)
    source_header, source_rows = parse_table(source)
    missing = [name for name in header if name not in source_header]
    if missing:
        return [f"columns {missing} are not in the source table's header {source_header}"]
    index = [source_header.index(name) for name in header]
    keys = {tuple(row[i] for i in index) for row in source_rows}
    return ["| " + " | ".join(row) + " |" for row in rows if tuple(row) not in keys]


def readme_tables(readme: Path) -> list[tuple[str, list[str]]]:
    """(figures path, table lines) of each README table tied to a generated table."""
    tied = []
    for prose, table in split_tables(readme.read_text()):
        refs = FIGURE_REF.findall(prose)
        if refs:
            tied.append((refs[0], table))
    return tied


def test_matching_ignores_padding_and_checks_every_shown_cell():
    source = ["| model | tau | speedup |", "|:--|--:|--:|", "| a   |  1.50 | 0.90 |", "| b | 1.20 | 1.10 |"]
    assert unmatched_rows(["| tau | model |", "|---|---|", "| 1.50 | a |"], source) == []
    assert unmatched_rows(["| model | tau |", "|---|---|", "| a | 1.51 |"], source) == ["| a | 1.51 |"]
    assert unmatched_rows(["| model | steps |", "|---|---|", "| a | 3 |"], source)[0].startswith("columns ['steps']")


def test_tables_are_tied_to_the_first_figures_file_named_before_them():
    text = "x\n| a |\n|---|\n| 1 |\nsee `figures/cpu/one.md`, `figures/cpu/two.md`\n\n| b |\n|---|\n| 2 |\n"
    tables = split_tables(text)
    assert [FIGURE_REF.findall(prose)[:1] for prose, _ in tables] == [[], ["figures/cpu/one.md"]]


@pytest.mark.parametrize("readme", [ROOT / "README.md"], ids=["README"])
def test_readme_result_tables_equal_the_generated_ones(readme: Path):
    tied = readme_tables(readme)
    assert len(tied) >= 5, f"expected the README's result tables, found {[ref for ref, _ in tied]}"
    for ref, table in tied:
        source = ROOT / ref
        assert source.is_file(), f"README table names {ref}, which does not exist"
        _, source_table = split_tables(source.read_text())[0]
        stale = unmatched_rows(table, source_table)
        assert not stale, f"README rows not in {ref} (rerun the figures or recopy the table):\n" + "\n".join(stale)


def test_recopy_script_updates_shown_rows_and_columns_only(tmp_path: Path):
    (tmp_path / "figures" / "cpu").mkdir(parents=True)
    source = ["| model | budget | tau | speedup |", "|:--|--:|--:|--:|"]
    source += ["| a | 16 | 1.40 | 0.50 |", "| a | 64 | 1.70 | 0.30 |", "| b | 64 | 2.10 | 0.40 |"]
    (tmp_path / "figures" / "cpu" / "t.md").write_text("caption\n\n" + "\n".join(source) + "\n")
    readme = tmp_path / "README.md"
    shown = ["| model | budget | tau |", "|:--|--:|--:|", "| b | 64 | 2.00 |", "| a | 64 | 1.60 |"]
    stale = "Intro.\n\nTaus (`figures/cpu/t.md`):\n\n" + "\n".join(shown) + "\n"
    readme.write_text(stale + "\nAfter.\n")
    assert SCRIPT.main(["--readme", str(readme), "--check"]) == 1 and readme.read_text() == stale + "\nAfter.\n"
    assert SCRIPT.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    ((_, table),) = [(p, t) for p, t in split_tables(text) if FIGURE_REF.findall(p)]
    assert parse_table(table)[1] == [["b", "64", "2.10"], ["a", "64", "1.70"]]
    assert unmatched_rows(table, source) == [] and text.startswith("Intro.") and text.endswith("After.\n")
    assert SCRIPT.main(["--readme", str(readme), "--check"]) == 0
    readme.write_text(text.replace("| b ", "| c "))
    assert SCRIPT.main(["--readme", str(readme)]) == 2  # a row the source lacks: reported, nothing written
    assert "| c " in readme.read_text()
