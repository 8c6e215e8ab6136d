//! Reading back what a files sink wrote: JSON lines, one object per row.

use std::path::Path;

use serde_json::{Map, Value};

/// Every row of the JSON-lines files under `dir`. With `strict` off, a line
/// that does not parse (a file being written) is skipped.
pub fn read_rows(dir: &Path, strict: bool) -> Vec<Map<String, Value>> {
    let mut rows = vec![];
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<Map<String, Value>>(line) {
                    Ok(row) => rows.push(row),
                    Err(e) if strict => panic!("{}: {line:?}: {e}", path.display()),
                    Err(_) => {}
                }
            }
        }
    }
    rows
}

pub fn int(row: &Map<String, Value>, column: &str) -> i64 {
    row.get(column)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("column {column} is not an integer in {row:?}"))
}

pub fn text(row: &Map<String, Value>, column: &str) -> String {
    row.get(column)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("column {column} is not a string in {row:?}"))
        .to_string()
}

/// A TIMESTAMP column as ms since the epoch: the files sink writes
/// `2023-11-14T22:13:20[.123]` (UTC, no zone).
pub fn millis(row: &Map<String, Value>, column: &str) -> i64 {
    if let Some(n) = row.get(column).and_then(Value::as_i64) {
        return n;
    }
    let s = text(row, column);
    parse_timestamp(&s).unwrap_or_else(|| panic!("column {column}: {s:?} is not a timestamp"))
}

pub fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim_end_matches('Z');
    let (date, time) = s.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>());
    let (h, mi, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let ms: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms)
}
