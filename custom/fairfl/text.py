"""Names read from files other centres send (site, method, seed and file names in results and leave-one-out files),
written into what people open: markdown (`markdown_text`) and CSV (`csv_text`). Plain functions, no imports of the
package, so the report, the leave-one-out tables and the benchmark pages use the same rules."""

from __future__ import annotations

# a name shown literally in markdown: no HTML tag or entity, link, image, code span or math, no table cell split
# (every other character stays as it is, so site-1, fedce_sum and paths read as they are)
MARKDOWN_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", **{c: "\\" + c for c in "\\`*[]|$"}}
# what makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)
CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def markdown_text(value) -> str:
    """`value` as markdown text that shows it as it is, wherever it goes (table cell, heading, note, caption):
    `MARKDOWN_ESCAPES`, and control characters and line breaks as spaces (no new row or block)."""
    return "".join(MARKDOWN_ESCAPES.get(c, c if c.isprintable() else " ") for c in str(value))


def csv_text(value):
    """`value` as a CSV cell a spreadsheet shows as text and never runs: a string starting with CSV_FORMULA_START gets
    a leading `'`, as OWASP advises; anything else is kept."""
    return "'" + value if isinstance(value, str) and value.startswith(CSV_FORMULA_START) else value
