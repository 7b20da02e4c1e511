"""The public data files of a release: `results.csv` (the released table) and `results.json` (the
public view of the result). Both hold DP values and public parameters only."""

from __future__ import annotations

from pathlib import Path


def write_data_files(result, directory: Path) -> list[Path]:
    """`results.csv` (the released table) and `results.json` (the public view): public data only."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    csv_path = directory / "results.csv"
    json_path = directory / "results.json"
    result.table.to_csv(csv_path, index=False, lineterminator="\n")
    json_path.write_text(result.to_json(indent=2) + "\n", encoding="utf-8")
    return [csv_path, json_path]
