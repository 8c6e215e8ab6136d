//! What a decoder says of a record it did not decode, and what of the
//! record its dead letter carries.

/// A record that was not decoded, by its index in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub index: usize,
    pub reason: String,
    /// The record, for a rejection found only when the batch was built
    /// (its caller no longer holds it); None when `push` said so.
    pub record: Option<Vec<u8>>,
}

/// The most of a rejected record a dead letter carries. A letter must fit
/// its destination (a Kafka message, about 1 MiB by default; a Kinesis
/// record, 1 MiB): one embedding a whole oversized record is refused, and
/// the query would fail on it at every restart. Even escaped (at most six
/// bytes a byte) 64 KiB stays well under.
pub const DEAD_LETTER_PREFIX_BYTES: usize = 64 << 10;

/// A rejected record as its dead letter carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterRecord {
    /// The record as text (invalid UTF-8 replaced), or its first
    /// [`DEAD_LETTER_PREFIX_BYTES`] when it is longer.
    pub record: String,
    /// The record's size in bytes.
    pub size: usize,
    pub truncated: bool,
}

impl LetterRecord {
    pub fn new(record: &[u8]) -> Self {
        let truncated = record.len() > DEAD_LETTER_PREFIX_BYTES;
        let kept = &record[..record.len().min(DEAD_LETTER_PREFIX_BYTES)];
        LetterRecord {
            record: String::from_utf8_lossy(kept).into_owned(),
            size: record.len(),
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letters_keep_a_bounded_prefix() {
        let small = LetterRecord::new(b"{\"a\": 1}");
        assert_eq!(
            (small.record.as_str(), small.size, small.truncated),
            ("{\"a\": 1}", 8, false)
        );
        let big = vec![b'x'; 3 << 20];
        let letter = LetterRecord::new(&big);
        assert_eq!(letter.record.len(), DEAD_LETTER_PREFIX_BYTES);
        assert_eq!((letter.size, letter.truncated), (3 << 20, true));
        // Cut inside a character: replaced, never a panic.
        let mut text = vec![b'a'; DEAD_LETTER_PREFIX_BYTES - 1];
        text.extend_from_slice("é".repeat(10).as_bytes());
        assert!(LetterRecord::new(&text).record.ends_with('\u{FFFD}'));
    }
}
