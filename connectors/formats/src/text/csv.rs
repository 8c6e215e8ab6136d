//! The CSV scanner: one delimited line into the declared columns.

use super::scanned::Raw;

/// Split one delimited line into the declared columns, in order. Fields may
/// be quoted with `"` (a doubled quote inside is one quote).
pub(crate) fn scan_csv(
    record: &[u8],
    delimiter: u8,
    out: &mut [Option<Raw>],
) -> std::result::Result<(), String> {
    let line = record.strip_suffix(b"\n").unwrap_or(record);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = 0;
    let mut i = 0;
    loop {
        let (start, end, next) = if line.get(i) == Some(&b'"') {
            let start = i + 1;
            let mut j = start;
            let mut doubled = false;
            loop {
                match line.get(j) {
                    None => return Err("unterminated quoted CSV field".into()),
                    Some(b'"') if line.get(j + 1) == Some(&b'"') => {
                        doubled = true;
                        j += 2;
                    }
                    Some(b'"') => break,
                    Some(_) => j += 1,
                }
            }
            if doubled {
                return Err("doubled quotes in CSV fields are not supported".into());
            }
            (start, j, j + 1)
        } else {
            let end = line[i..]
                .iter()
                .position(|&c| c == delimiter)
                .map_or(line.len(), |p| i + p);
            (i, end, end)
        };
        if fields < out.len() {
            out[fields] = Some(if start == end {
                Raw::Null
            } else {
                Raw::Str {
                    start: start as u32,
                    end: end as u32,
                    escaped: false,
                }
            });
        }
        fields += 1;
        match line.get(next) {
            None => break,
            Some(&c) if c == delimiter => i = next + 1,
            Some(_) => return Err("garbage after a quoted CSV field".into()),
        }
    }
    if fields != out.len() {
        return Err(format!("expected {} CSV fields, found {fields}", out.len()));
    }
    Ok(())
}
