//! The JSON scanner: the raw value of each declared field of one flat
//! object, with a vectorised fast path for the common case.

use super::scanned::{Raw, Scanned};

/// The positions of every `"` of `record` into `quotes`, 16 bytes at a time.
/// Returns `None` if the record holds a backslash (its quotes may be
/// escaped, so they do not delimit strings), else whether it is all ASCII.
fn find_quotes(record: &[u8], quotes: &mut Vec<u32>) -> Option<bool> {
    quotes.clear();
    let mut high = 0u32;
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
        };
        // SAFETY: SSE2 is part of every x86_64 target; each load reads the
        // 16 bytes at `i`, which are inside `record` (unaligned load).
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            while i + 16 <= record.len() {
                let chunk = _mm_loadu_si128(record.as_ptr().add(i) as *const __m128i);
                if _mm_movemask_epi8(_mm_cmpeq_epi8(chunk, backslash)) != 0 {
                    return None;
                }
                high |= _mm_movemask_epi8(chunk) as u32;
                let mut q = _mm_movemask_epi8(_mm_cmpeq_epi8(chunk, quote)) as u32;
                while q != 0 {
                    quotes.push(i as u32 + q.trailing_zeros());
                    q &= q - 1;
                }
                i += 16;
            }
        }
    }
    for (j, &c) in record.iter().enumerate().skip(i) {
        match c {
            b'"' => quotes.push(j as u32),
            b'\\' => return None,
            _ => high |= (c >> 7) as u32,
        }
    }
    Some(high == 0)
}

/// The common case of [`scan_json`] without byte-by-byte string scanning: a
/// flat object of strings, numbers and literals without backslashes. The
/// quotes are found first (vectorised), then the structure is walked from
/// quote to quote. Returns `None` whenever the record is anything else, and
/// [`scan_json`] then decides (with the same results for every record this
/// accepts).
pub(crate) fn fast_scan_json(
    record: &[u8],
    names: &[Vec<u8>],
    out: &mut [Option<Raw>],
    quotes: &mut Vec<u32>,
    keys: &mut Vec<(Vec<u8>, Option<usize>)>,
) -> Option<Scanned> {
    let ascii = find_quotes(record, quotes)?;
    let b = record;
    let ws = |mut i: usize| {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    };
    let mut q = quotes.iter().map(|&p| p as usize);
    let mut i = ws(0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(i + 1);
    let mut nth_key = 0;
    loop {
        // The key: its quotes are the next two.
        if b.get(i) != Some(&b'"') || q.next() != Some(i) {
            return None;
        }
        let key_end = q.next()?;
        let key = &b[i + 1..key_end];
        i = ws(key_end + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(i + 1);
        let value = match *b.get(i)? {
            b'"' => {
                if q.next() != Some(i) {
                    return None;
                }
                let end = q.next()?;
                let v = Raw::Str {
                    start: (i + 1) as u32,
                    end: end as u32,
                    escaped: false,
                };
                i = end + 1;
                v
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                Raw::Num {
                    start: start as u32,
                    end: i as u32,
                }
            }
            b't' if b[i..].starts_with(b"true") => {
                i += 4;
                Raw::Bool(true)
            }
            b'f' if b[i..].starts_with(b"false") => {
                i += 5;
                Raw::Bool(false)
            }
            b'n' if b[i..].starts_with(b"null") => {
                i += 4;
                Raw::Null
            }
            _ => return None,
        };
        let slot = match keys.get(nth_key) {
            Some((k, slot)) if k.as_slice() == key => *slot,
            _ => {
                let slot = names.iter().position(|n| n.as_slice() == key);
                keys.truncate(nth_key);
                if nth_key < 64 {
                    keys.push((key.to_vec(), slot));
                }
                slot
            }
        };
        nth_key += 1;
        if let Some(slot) = slot {
            out[slot] = Some(value);
        }
        i = ws(i);
        match b.get(i) {
            Some(b',') => i = ws(i + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    if ws(i + 1) != b.len() || q.next().is_some() {
        return None;
    }
    Some(Scanned { utf8: ascii })
}

/// Scan one flat JSON object, keeping the raw values of declared fields.
pub(crate) fn scan_json(
    record: &[u8],
    names: &[Vec<u8>],
    out: &mut [Option<Raw>],
) -> std::result::Result<(), String> {
    let mut s = Scanner { b: record, i: 0 };
    s.ws();
    s.expect(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.ws();
            s.expect(b'"')?;
            let (key_start, key_end, _) = s.string()?;
            let key = &record[key_start..key_end];
            s.ws();
            s.expect(b':')?;
            s.ws();
            let slot = names.iter().position(|n| n.as_slice() == key);
            let value = s.value()?;
            if let Some(slot) = slot {
                out[slot] = Some(value);
            }
            s.ws();
            match s.next() {
                Some(b',') => continue,
                Some(b'}') => break,
                Some(c) => {
                    return Err(s.error(&format!("expected ',' or '}}', found {:?}", c as char)));
                }
                None => return Err("truncated JSON object".into()),
            }
        }
    }
    s.ws();
    if s.i != record.len() {
        return Err(s.error("trailing bytes after the JSON object"));
    }
    Ok(())
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek();
        self.i += 1;
        c
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn error(&self, what: &str) -> String {
        format!("bad JSON at byte {}: {what}", self.i.min(self.b.len()))
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        match self.next() {
            Some(x) if x == c => Ok(()),
            Some(x) => {
                self.i -= 1;
                Err(self.error(&format!("expected {:?}, found {:?}", c as char, x as char)))
            }
            None => Err(self.error(&format!("expected {:?}, found the end", c as char))),
        }
    }

    /// After the opening quote: where the contents start and end, and
    /// whether they hold escapes.
    fn string(&mut self) -> std::result::Result<(usize, usize, bool), String> {
        let start = self.i;
        let mut escaped = false;
        loop {
            match self.b[self.i..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\')
            {
                None => {
                    self.i = self.b.len();
                    return Err(self.error("unterminated string"));
                }
                Some(p) => {
                    self.i += p;
                    if self.b[self.i] == b'"' {
                        let end = self.i;
                        self.i += 1;
                        return Ok((start, end, escaped));
                    }
                    escaped = true;
                    self.i += 2;
                    if self.i > self.b.len() {
                        return Err(self.error("unterminated string"));
                    }
                }
            }
        }
    }

    fn value(&mut self) -> std::result::Result<Raw, String> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let (start, end, escaped) = self.string()?;
                Ok(Raw::Str {
                    start: start as u32,
                    end: end as u32,
                    escaped,
                })
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.i += 1;
                }
                Ok(Raw::Num {
                    start: start as u32,
                    end: self.i as u32,
                })
            }
            Some(b't') => self.literal(b"true", Raw::Bool(true)),
            Some(b'f') => self.literal(b"false", Raw::Bool(false)),
            Some(b'n') => self.literal(b"null", Raw::Null),
            Some(b'{' | b'[') => {
                let start = self.i;
                self.skip_nested()?;
                Ok(Raw::Nested {
                    start: start as u32,
                    end: self.i as u32,
                })
            }
            Some(c) => Err(self.error(&format!("unexpected {:?}", c as char))),
            None => Err(self.error("truncated value")),
        }
    }

    fn literal(&mut self, word: &[u8], v: Raw) -> std::result::Result<Raw, String> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.error("bad literal"))
        }
    }

    /// Step over an object or array, which must be valid JSON even in a
    /// field that is not declared.
    fn skip_nested(&mut self) -> std::result::Result<(), String> {
        let start = self.i;
        self.find_nested_end()?;
        serde_json::from_slice::<serde::de::IgnoredAny>(&self.b[start..self.i])
            .map(drop)
            .map_err(|e| format!("bad JSON in the object or array at byte {start}: {e}"))
    }

    /// Just past the bracket that brings the depth back to zero (of any
    /// kind: a mismatch is for [`Self::skip_nested`] to find).
    fn find_nested_end(&mut self) -> std::result::Result<(), String> {
        let mut depth = 0usize;
        loop {
            match self.next() {
                Some(b'{' | b'[') => depth += 1,
                Some(b'}' | b']') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Some(b'"') => {
                    self.string()?;
                }
                Some(_) => {}
                None => return Err(self.error("truncated object or array")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_json_scan_agrees_with_the_careful_one() {
        let names: Vec<Vec<u8>> = ["ad_id", "event_type", "event_time", "n"]
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect();
        let long = format!(
            r#"{{"user_id": "{}", "ad_id": "a-é-1", "event_type": "view", "event_time": "1795327431378", "ip_address": "1.2.3.4"}}"#,
            "x".repeat(100)
        );
        let records: Vec<&[u8]> = vec![
            br#"{"user_id": "e5626786-5783-4791-9b3d-a98a428d539b", "page_id": "a9bbae83-2d56-476d-ac64-7c5dd7b63837", "ad_id": "a6002d8a-46ea-4c7f-a04a-0a5aed875fce", "ad_type": "banner", "event_type": "view", "event_time": "1795327431378", "ip_address": "1.2.3.4"}"#,
            br#"{"ad_id":"a","event_type":"click","event_time":12,"n":-3.5e2,"ok":true,"no":false,"z":null}"#,
            b" {\n\t\"ad_id\" : \"a\" ,\r\n \"n\":7 } \n",
            br#"{"ad_id": "a", "ad_id": "b"}"#,
            br#"{}"#,
            br#"{"ad_id": "a\"b", "event_type": "view"}"#,
            br#"{"ad_id": "a", "x": {"y": 1}}"#,
            br#"{"ad_id": "a", "x": [1, 2]}"#,
            br#"{"ad_id": "a",}"#,
            br#"{"ad_id": "a"} x"#,
            br#"{"ad_id": "a""#,
            br#"{"ad_id" "a"}"#,
            br#"{"ad_id": tru}"#,
            br#"{"ad_id": "a", "n": nul}"#,
            br#"["ad_id"]"#,
            br#"{"ad_id": "unterminated}"#,
            long.as_bytes(),
            b"",
        ];
        let (mut quotes, mut keys) = (vec![], vec![]);
        let mut fast_taken = 0;
        for record in records {
            let mut careful = vec![None; names.len()];
            let verdict = scan_json(record, &names, &mut careful);
            let mut fast = vec![None; names.len()];
            if let Some(scanned) = fast_scan_json(record, &names, &mut fast, &mut quotes, &mut keys)
            {
                fast_taken += 1;
                assert!(verdict.is_ok(), "{:?}", String::from_utf8_lossy(record));
                assert_eq!(fast, careful, "{:?}", String::from_utf8_lossy(record));
                assert_eq!(scanned.utf8, record.is_ascii());
            }
        }
        assert_eq!(fast_taken, 5);
    }
}
