#!/usr/bin/env python3
"""Fill in (or check) the expected rows of sqllogictest files with SQLite.

Usage:
    python3 tests/sql/sqlite_expect.py FILE.slt [FILE.slt ...]
    python3 tests/sql/sqlite_expect.py --check FILE.slt [FILE.slt ...]

Each file is replayed in a fresh in-memory SQLite database, record by record:

* `statement ok` runs as written (CREATE TABLE, INSERT, UPDATE, DELETE,
  CREATE VIEW). SQLite takes the corpus's column types as they are (BIGINT
  and INT are integers, DOUBLE is real, BOOLEAN holds 0/1, VARCHAR and
  TIMESTAMP hold text).
* `statement error` is not run and not touched.
* `query <types> rowsort` runs its SQL; each value is written by its
  column's type letter (see tests/sql/README.md): I integer, R float to 4
  places without trailing zeros (`3`, not `3.0`; `-0` is `0`), T text
  (`(empty)` for ''; text that looks like a timestamp, `2024-01-01 10:00:00`,
  is written `2024-01-01T10:00:00`), B boolean (0/1 as false/true), NULL as
  `NULL`. The rows are sorted as strings and written after `----`,
  replacing what was there. `nosort` keeps SQLite's order.
* A query whose block of comment lines directly above it holds
  `# expected: by hand` or `# expected: datafusion` is not run and not
  touched: its rows were written by other means.

SQLite lacks `bool_and` and `bool_or`; the script registers them (NULLs are
skipped, no value gives NULL), so they need no marker.

With --check nothing is written: every query whose written rows differ from
SQLite's (compared as sorted lines, whitespace collapsed) is reported, and
the exit status is 1 if any does.

A query SQLite cannot run (or whose values do not fit its type letters) is
reported on stderr as FILE:LINE and left as it is; unless it is marked as
above, the exit status is then 1. A failing `statement ok` is reported the
same way and the file is not rewritten, since every later answer would be
off.
"""

import re
import sqlite3
import sys

MARKERS = ("# expected: by hand", "# expected: datafusion")
TIMESTAMP_TEXT = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?$")
TIMESTAMP_LITERAL = re.compile(r"\bTIMESTAMP\s+('[^']*')", re.IGNORECASE)


class BoolAnd:
    def __init__(self):
        self.value = None

    def step(self, x):
        if x is not None:
            self.value = bool(x) if self.value is None else (self.value and bool(x))

    def finalize(self):
        return None if self.value is None else int(self.value)


class BoolOr:
    def __init__(self):
        self.value = None

    def step(self, x):
        if x is not None:
            self.value = bool(x) if self.value is None else (self.value or bool(x))

    def finalize(self):
        return None if self.value is None else int(self.value)


def connect():
    db = sqlite3.connect(":memory:")
    db.create_aggregate("bool_and", 1, BoolAnd)
    db.create_aggregate("bool_or", 1, BoolOr)
    return db


def to_sqlite(sql):
    """The few spellings SQLite reads differently: TIMESTAMP '...' is text."""
    return TIMESTAMP_LITERAL.sub(r"\1", sql)


def format_float(x):
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    s = "%.4f" % x
    s = s.rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def format_text(x):
    if x == "":
        return "(empty)"
    m = TIMESTAMP_TEXT.match(x)
    if m:
        day, time, frac = m.groups()
        out = day + "T" + time
        if frac and frac.strip("0"):
            width = 3 if len(frac) <= 3 else 6 if len(frac) <= 6 else 9
            out += "." + frac.ljust(width, "0")
        return out
    return x


def format_value(value, letter):
    if value is None:
        return "NULL"
    if letter == "I":
        if isinstance(value, int):
            return str(value)
        raise ValueError("type I but SQLite gave %r" % (value,))
    if letter == "R":
        if isinstance(value, (int, float)):
            return format_float(float(value))
        raise ValueError("type R but SQLite gave %r" % (value,))
    if letter == "B":
        if isinstance(value, int) and value in (0, 1):
            return "true" if value else "false"
        raise ValueError("type B but SQLite gave %r" % (value,))
    if letter == "T":
        if isinstance(value, str):
            return format_text(value)
        if isinstance(value, float):
            return format_float(value)
        return str(value)
    raise ValueError("unknown type letter %r" % letter)


def normalise(line):
    return " ".join(line.split())


class Record:
    """One statement or query: where it is in the file's lines."""

    def __init__(self, kind, header_at, header):
        self.kind = kind            # "statement" or "query"
        self.header_at = header_at  # index of the header line
        self.header = header.split()
        self.sql_lines = []
        self.dashes_at = None       # index of '----', if any
        self.rows_from = None       # first result line index
        self.rows_to = None         # one past the last result line
        self.marked = False

    @property
    def sql(self):
        return "\n".join(self.sql_lines)


def parse(lines):
    records = []
    i = 0
    n = len(lines)
    comments = []
    while i < n:
        line = lines[i]
        stripped = line.strip()
        if stripped == "":
            comments = []
            i += 1
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            i += 1
            continue
        words = stripped.split()
        if words[0] not in ("statement", "query"):
            # hash-threshold, halt, skipif, ...: nothing to do.
            comments = []
            i += 1
            continue
        rec = Record(words[0], i, stripped)
        rec.marked = any(c.startswith(m) for c in comments for m in MARKERS)
        comments = []
        i += 1
        while i < n and lines[i].strip() != "" and lines[i].strip() != "----":
            rec.sql_lines.append(lines[i])
            i += 1
        if i < n and lines[i].strip() == "----":
            rec.dashes_at = i
            i += 1
            rec.rows_from = i
            while i < n and lines[i].strip() != "":
                i += 1
            rec.rows_to = i
        records.append(rec)
    return records


def run_query(db, rec):
    """The query's rows, formatted and sorted, or raise ValueError."""
    if len(rec.header) < 2:
        raise ValueError("query without type letters")
    letters = rec.header[1]
    sort = rec.header[2] if len(rec.header) > 2 else "nosort"
    if sort not in ("rowsort", "nosort"):
        raise ValueError("sort mode %r is not handled" % sort)
    try:
        cur = db.execute(to_sqlite(rec.sql))
        rows = cur.fetchall()
    except sqlite3.Error as e:
        raise ValueError("SQLite cannot run it: %s" % e)
    width = len(cur.description or ())
    if width != len(letters):
        raise ValueError("%d type letters for %d columns" % (len(letters), width))
    out = [" ".join(format_value(v, t) for v, t in zip(row, letters)) for row in rows]
    if sort == "rowsort":
        out.sort()
    return out


def process(path, check):
    """Returns (problems that fail the run, number of queries filled)."""
    with open(path) as f:
        text = f.read()
    lines = text.split("\n")
    trailing_newline = text.endswith("\n")
    if trailing_newline:
        lines = lines[:-1]
    records = parse(lines)
    db = connect()
    failures = 0
    statement_failed = False
    replacements = []  # (record, rows)
    for rec in records:
        where = "%s:%d" % (path, rec.header_at + 1)
        if rec.kind == "statement":
            if len(rec.header) < 2 or rec.header[1] != "ok":
                continue  # statement error: not run, not touched
            try:
                db.executescript(to_sqlite(rec.sql))
            except sqlite3.Error as e:
                print("%s: statement failed in SQLite: %s" % (where, e), file=sys.stderr)
                failures += 1
                statement_failed = True
            continue
        if rec.marked:
            continue
        try:
            rows = run_query(db, rec)
        except ValueError as e:
            print("%s: %s" % (where, e), file=sys.stderr)
            failures += 1
            continue
        if check:
            written = []
            if rec.rows_from is not None:
                written = [normalise(l) for l in lines[rec.rows_from:rec.rows_to]]
            got = [normalise(l) for l in rows]
            sort = len(rec.header) > 2 and rec.header[2] == "rowsort"
            if (sorted(written) if sort else written) != (sorted(got) if sort else got):
                print("%s: rows differ from SQLite's" % where, file=sys.stderr)
                print("  written: %s" % (written,), file=sys.stderr)
                print("  SQLite:  %s" % (got,), file=sys.stderr)
                failures += 1
        else:
            replacements.append((rec, rows))
    if check or statement_failed:
        if statement_failed and not check:
            print("%s: not rewritten" % path, file=sys.stderr)
        return failures, 0
    # Rewrite from the end so earlier indices stay valid.
    for rec, rows in reversed(replacements):
        if rec.dashes_at is None:
            at = rec.header_at + 1 + len(rec.sql_lines)
            lines[at:at] = ["----"] + rows
        else:
            lines[rec.rows_from:rec.rows_to] = rows
    out = "\n".join(lines) + ("\n" if trailing_newline else "")
    if out != text:
        with open(path, "w") as f:
            f.write(out)
    return failures, len(replacements)


def main(argv):
    check = False
    paths = []
    for arg in argv:
        if arg == "--check":
            check = True
        elif arg in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            paths.append(arg)
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    failures = 0
    for path in paths:
        f, filled = process(path, check)
        failures += f
        if not check:
            print("%s: %d queries filled" % (path, filled))
    if failures:
        print("%d problem(s)" % failures, file=sys.stderr)
        return 1
    if check:
        print("all queries agree with SQLite")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
