"""The tables the CLI prints, with what a person pastes (ids, paths, names, fingerprints) never cut:
Rich fits a table to the terminal by wrapping cells and shortening them with an ellipsis, so such a
column is kept on one line at its whole width, and the other columns fold instead of being cut.
A table that cannot fit that way is printed as one block of `column: value` lines per row (a
terminal wraps a long line on screen but copies it whole)."""

from __future__ import annotations

from rich.console import Console


class Table:
    """Columns by header; `whole` names the columns whose values are pasted."""

    def __init__(self, *columns: str, whole: tuple[str, ...] = ()) -> None:
        unknown = set(whole) - set(columns)
        if unknown:
            raise ValueError(f"whole names no column: {sorted(unknown)}")
        self.columns, self.whole, self.rows = columns, whole, []

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)

    @property
    def row_count(self) -> int:
        return len(self.rows)

    #: the narrowest a folded column may get before the rows are printed as lines instead
    FOLDED_MIN = 12

    def _widths(self, console: Console) -> tuple[list[int], int]:
        """Each column's width (a pasted one: its longest value; another: its longest word, at most
        FOLDED_MIN) and the whole table's, borders and padding included."""
        widths = []
        for i, header in enumerate(self.columns):
            texts = [header] + [console.render_str(row[i]).plain for row in self.rows]
            if header in self.whole:
                widths.append(max(len(t) for t in texts))
            else:
                widths.append(min(self.FOLDED_MIN, max(len(w) for t in texts for w in t.split() or [""])))
        return widths, sum(widths) + 3 * len(widths) + 1

    def print(self, console: Console) -> None:
        """The table if its pasted columns fit whole in the console's width, else the rows as lines."""
        from rich.table import Column
        from rich.table import Table as RichTable

        widths, needed = self._widths(console)
        if needed > console.width:
            for row in self.rows:
                for header, cell in zip(self.columns, row, strict=True):
                    console.print(f"[bold]{header}[/bold]: {cell}", soft_wrap=True, highlight=False)
                console.print()
            return
        table = RichTable(*[Column(h, no_wrap=True, min_width=w) if h in self.whole else Column(h, overflow="fold")
                            for h, w in zip(self.columns, widths, strict=True)])
        for row in self.rows:
            table.add_row(*row)
        console.print(table)
