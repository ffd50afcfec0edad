"""Text from summaries made safe to show: nothing that drives a terminal, opens a spreadsheet
formula or breaks a markdown table. `printable` is the one sanitiser; the others build on it, and
:func:`package_logger` applies it to every log line of the package."""

from __future__ import annotations

import logging
import re
import unicodedata

# Whole ECMA-48 sequences, so that no "[31m" is left behind: CSI (ESC [ or 8-bit CSI) up to its final
# byte; OSC, DCS, SOS, PM and APC strings up to BEL or ST (or the end, as a terminal would swallow
# it); two-byte escapes such as ESC c (reset).
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
_LINE_BREAKS = re.compile(r"[\t\n\v\f\r\x85\u2028\u2029]+")
# controls, format characters (bidi overrides, zero-width), lone surrogates (unprintable in UTF-8)
_INVISIBLE = {"Cc", "Cf", "Cs"}
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def printable(value: object) -> str:
    """`value` as one line of plain text: escape sequences and control characters removed, line
    breaks and tabs turned into a space."""
    text = str(value)
    if text.isprintable():
        return text
    text = _LINE_BREAKS.sub(" ", _ESCAPE_SEQUENCE.sub("", text))
    return "".join(ch for ch in text if unicodedata.category(ch) not in _INVISIBLE)


def csv_cell(value: object) -> object:
    """A CSV cell: numbers as they are; text printable, with a leading quote where a spreadsheet
    would take it for a formula (OWASP's guard against CSV injection)."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = printable(value)
    return f"'{text}" if text.lstrip().startswith(_FORMULA_STARTS) else text


def markdown_cell(value: object) -> str:
    """A markdown table cell: printable, with `|` escaped so that it cannot add a column."""
    return printable(value).replace("|", "\\|")


class _PrintableRecords(logging.Filter):
    """A record's message made printable before any handler sees it: a label, a path, a run id or an
    error read from an input loses its terminal escapes, whatever handler the application set up."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.isprintable():
            record.msg, record.args = printable(message), ()
        return True


_PRINTABLE_RECORDS = _PrintableRecords()


def package_logger(name: str) -> logging.Logger:
    """The module's logger (``logging.getLogger(name)``), whose every line is printable."""
    logger = logging.getLogger(name)
    if _PRINTABLE_RECORDS not in logger.filters:
        logger.addFilter(_PRINTABLE_RECORDS)
    return logger
