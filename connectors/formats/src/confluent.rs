//! The Confluent wire format: a magic byte and a schema id ahead of each
//! record.

/// The first byte of a record in the Confluent wire format.
pub const CONFLUENT_MAGIC: u8 = 0;

/// The schema id of a Confluent-framed record and the bytes after it.
pub(crate) fn confluent_header(record: &[u8]) -> std::result::Result<(u32, &[u8]), String> {
    match record {
        [CONFLUENT_MAGIC, a, b, c, d, rest @ ..] => {
            Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest))
        }
        [] => Err("empty record: no Confluent wire-format header".into()),
        [first, ..] if *first != CONFLUENT_MAGIC => Err(format!(
            "not in the Confluent wire format: the first byte is {first:#04x}, not 0x00"
        )),
        _ => Err(format!(
            "a record of {} bytes is too short for the Confluent header (5 bytes)",
            record.len()
        )),
    }
}

/// The Confluent header of schema `id`.
pub(crate) fn confluent_prefix(id: u32) -> [u8; 5] {
    let b = id.to_be_bytes();
    [CONFLUENT_MAGIC, b[0], b[1], b[2], b[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confluent_headers_are_checked() {
        assert_eq!(confluent_header(&[0, 0, 0, 1, 2, 9]), Ok((258, &[9u8][..])));
        assert_eq!(confluent_header(&confluent_prefix(7)), Ok((7, &[][..])));
        assert!(
            confluent_header(&[1, 0, 0, 0, 1])
                .unwrap_err()
                .contains("0x01")
        );
        assert!(
            confluent_header(&[0, 0, 1])
                .unwrap_err()
                .contains("too short")
        );
        assert!(confluent_header(&[]).unwrap_err().contains("empty"));
    }
}
