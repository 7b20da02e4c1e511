"""The public data files of a release: `results.csv` (the released table) and `results.json` (the
public view of the result). Both hold DP values and public parameters only.

A CSV is opened in spreadsheets, which execute a cell starting with =, +, -, @, a tab or a carriage
return as a formula (CSV injection). As OWASP recommends, such *text* cells get a leading single
quote, so `=HYPERLINK("x")` shows as text; numbers, negative ones included, stay numbers. The JSON
keeps every value exact (JSON is not executed), and the HTML report escapes it (Jinja autoescape).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

#: first characters a spreadsheet reads as the start of a formula (OWASP, "CSV Injection")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise_cell(value):
    """A text cell a spreadsheet would execute, prefixed with a single quote; anything else as is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def safe_for_spreadsheets(table: pd.DataFrame) -> pd.DataFrame:
    """The table with every text cell neutralised (numeric columns untouched), and text headers too."""
    safe = table.copy()
    for column in safe.columns:
        values = safe[column]
        if not (pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)):
            safe[column] = values.map(neutralise_cell, na_action="ignore")
    safe.columns = [neutralise_cell(c) for c in safe.columns]
    return safe


def write_data_files(result, directory: Path) -> list[Path]:
    """`results.csv` (the released table, spreadsheet-safe) and `results.json` (the public view,
    exact): public data only."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    csv_path = directory / "results.csv"
    json_path = directory / "results.json"
    # text quoted (a key holding a line break stays one cell), numbers bare (they stay numbers)
    safe_for_spreadsheets(result.table).to_csv(csv_path, index=False, lineterminator="\n",
                                               quoting=csv.QUOTE_NONNUMERIC)
    json_path.write_text(result.to_json(indent=2) + "\n", encoding="utf-8")
    return [csv_path, json_path]
