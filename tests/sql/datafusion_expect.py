#!/usr/bin/env python3
"""Check sqllogictest files against DataFusion in batch, or fill the queries
marked `# expected: datafusion` with DataFusion's rows.

Needs the DataFusion Python bindings of the engine's DataFusion version:
    python3 -m venv /tmp/df && /tmp/df/bin/pip install datafusion==55.0.0

Usage:
    /tmp/df/bin/python tests/sql/datafusion_expect.py --check FILE.slt ...
    /tmp/df/bin/python tests/sql/datafusion_expect.py FILE.slt ...

Each file is replayed in a fresh DataFusion SessionContext: `statement ok`
runs as written (tables are in memory; INSERT, UPDATE and DELETE change
them), `statement error` is not run.

--check runs every query (marked or not) and reports each one whose written
rows differ from DataFusion's, or whose type letters do not fit the result's
column types; exit status 1 if any. Without --check only the queries marked
`# expected: datafusion` are (re)written; the others are left to
sqlite_expect.py.

Values are written by the result column's Arrow type, as tests/sql/README.md
says (the letters are not used for it), and rows are sorted for `rowsort`.
This is a batch answer over the rows as they are: what Skein must agree
with, not a test of Skein.
"""

import sys
from decimal import Decimal

import pyarrow as pa
from datafusion import SessionContext

sys.path.insert(0, __file__.rsplit("/", 1)[0] if "/" in __file__ else ".")
from sqlite_expect import format_float, normalise, parse  # noqa: E402

DF_MARKER = "# expected: datafusion"


def format_time(dt):
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond:
        frac = "%06d" % dt.microsecond
        text += "." + (frac[:3] if frac.endswith("000") else frac)
    return text


def format_value(value, typ):
    if value is None:
        return "NULL"
    if pa.types.is_boolean(typ):
        return "true" if value else "false"
    if pa.types.is_integer(typ):
        return str(value)
    if pa.types.is_floating(typ):
        return format_float(float(value))
    if pa.types.is_decimal(typ):
        return format_float(float(Decimal(value)))
    if pa.types.is_timestamp(typ):
        return format_time(value)
    if pa.types.is_date(typ):
        return value.isoformat()
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or str(typ) == "string_view":
        return "(empty)" if value == "" else value
    return str(value)


def letter_fits(letter, typ):
    if letter == "I":
        return pa.types.is_integer(typ)
    if letter == "R":
        return pa.types.is_floating(typ) or pa.types.is_decimal(typ)
    if letter == "B":
        return pa.types.is_boolean(typ)
    if letter == "T":
        return not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ))
    return False


def run_query(ctx, rec):
    letters = rec.header[1]
    sort = rec.header[2] if len(rec.header) > 2 else "nosort"
    table = ctx.sql(rec.sql).to_arrow_table()
    if table.num_columns != len(letters):
        raise ValueError("%d type letters for %d columns" % (len(letters), table.num_columns))
    bad = [
        "%s:%s" % (f.name, f.type)
        for f, l in zip(table.schema, letters)
        if not letter_fits(l, f.type)
    ]
    if bad:
        raise ValueError("type letters %s do not fit %s" % (letters, ", ".join(bad)))
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    types = [f.type for f in table.schema]
    rows = [
        " ".join(format_value(cols[c][r], types[c]) for c in range(len(cols)))
        for r in range(table.num_rows)
    ]
    if sort == "rowsort":
        rows.sort()
    return rows


def process(path, check):
    with open(path) as f:
        text = f.read()
    lines = text.split("\n")
    trailing_newline = text.endswith("\n")
    if trailing_newline:
        lines = lines[:-1]
    ctx = SessionContext()
    failures = 0
    replacements = []
    for rec in parse(lines):
        where = "%s:%d" % (path, rec.header_at + 1)
        if rec.kind == "statement":
            if rec.header[1:2] == ["ok"]:
                try:
                    ctx.sql(rec.sql).collect()
                except Exception as e:  # noqa: BLE001
                    print("%s: statement failed in DataFusion: %s" % (where, e), file=sys.stderr)
                    failures += 1
            continue
        marked_df = False
        # parse() only says whether a marker is there; find which one.
        j = rec.header_at - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            if lines[j].strip().startswith(DF_MARKER):
                marked_df = True
            j -= 1
        if not check and not marked_df:
            continue
        try:
            rows = run_query(ctx, rec)
        except Exception as e:  # noqa: BLE001
            print("%s: %s" % (where, str(e).splitlines()[0] if str(e) else e), file=sys.stderr)
            failures += 1
            continue
        if check:
            written = []
            if rec.rows_from is not None:
                written = [normalise(l) for l in lines[rec.rows_from:rec.rows_to]]
            if sorted(written) != sorted(normalise(r) for r in rows):
                print("%s: rows differ from DataFusion's" % where, file=sys.stderr)
                print("  written:    %s" % (written,), file=sys.stderr)
                print("  DataFusion: %s" % (rows,), file=sys.stderr)
                failures += 1
        else:
            replacements.append((rec, rows))
    for rec, rows in reversed(replacements):
        if rec.dashes_at is None:
            at = rec.header_at + 1 + len(rec.sql_lines)
            lines[at:at] = ["----"] + rows
        else:
            lines[rec.rows_from:rec.rows_to] = rows
    if replacements:
        out = "\n".join(lines) + ("\n" if trailing_newline else "")
        if out != text:
            with open(path, "w") as f:
                f.write(out)
    return failures, len(replacements)


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths or "-h" in argv or "--help" in argv:
        print(__doc__)
        return 2 if not paths else 0
    failures = 0
    for path in paths:
        f, filled = process(path, check)
        failures += f
        if not check:
            print("%s: %d queries filled from DataFusion" % (path, filled))
    if failures:
        print("%d problem(s)" % failures, file=sys.stderr)
        return 1
    if check:
        print("all queries agree with DataFusion")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
