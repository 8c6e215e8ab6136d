//! The protobuf wire format, read and written by hand: varints, tags and
//! the four kinds of field, and the Confluent message indexes.

/// The wire types.
pub(crate) const VARINT: u8 = 0;
pub(crate) const I64: u8 = 1;
pub(crate) const LEN: u8 = 2;
pub(crate) const I32: u8 = 5;

/// Reads one message's bytes.
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) i: usize,
}

type R<T> = std::result::Result<T, String>;

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b, i: 0 }
    }

    pub(crate) fn done(&self) -> bool {
        self.i >= self.b.len()
    }

    pub(crate) fn varint(&mut self) -> R<u64> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let byte = *self
                .b
                .get(self.i)
                .ok_or_else(|| format!("truncated varint at byte {}", self.i))?;
            self.i += 1;
            if shift == 63 && byte > 1 {
                return Err(format!("varint too long at byte {}", self.i - 1));
            }
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(v);
            }
        }
        Err(format!("varint too long at byte {}", self.i))
    }

    /// A field's number and wire type.
    pub(crate) fn tag(&mut self) -> R<(u32, u8)> {
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(format!("bad field number {number} at byte {}", self.i));
        }
        Ok((number as u32, (key & 7) as u8))
    }

    pub(crate) fn fixed<const N: usize>(&mut self) -> R<[u8; N]> {
        let s = self
            .b
            .get(self.i..self.i + N)
            .ok_or_else(|| format!("truncated {}-byte field at byte {}", N, self.i))?;
        self.i += N;
        Ok(s.try_into().expect("N bytes"))
    }

    /// A length-delimited field's bytes, as positions in the message.
    pub(crate) fn len_delimited(&mut self) -> R<(usize, usize)> {
        let n = self.varint()?;
        let start = self.i;
        let end = start
            .checked_add(usize::try_from(n).map_err(|_| "length too large".to_string())?)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| format!("truncated field of {n} bytes at byte {start}"))?;
        self.i = end;
        Ok((start, end))
    }

    /// Step over a field of wire type `wire`.
    pub(crate) fn skip(&mut self, wire: u8) -> R<()> {
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.fixed::<8>().map(drop),
            LEN => self.len_delimited().map(drop),
            I32 => self.fixed::<4>().map(drop),
            other => Err(format!(
                "wire type {other} (groups or garbage) at byte {}",
                self.i
            )),
        }
    }
}

pub(crate) fn zigzag_decode(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn zigzag_encode(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_tag(out: &mut Vec<u8>, number: u32, wire: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire));
}

/// The message indexes after a Confluent header: the path from the schema
/// file to the message (`[0]`, the first message, is written as one 0).
/// Returns them and the bytes after.
pub(crate) fn message_indexes(b: &[u8]) -> R<(Vec<usize>, &[u8])> {
    let mut r = Reader::new(b);
    let count = zigzag_decode(r.varint()?);
    if count == 0 {
        return Ok((vec![0], &b[r.i..]));
    }
    if !(1..=64).contains(&count) {
        return Err(format!("bad message-index count {count}"));
    }
    let mut path = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let i = zigzag_decode(r.varint()?);
        path.push(usize::try_from(i).map_err(|_| format!("bad message index {i}"))?);
    }
    Ok((path, &b[r.i..]))
}

/// The message indexes of `path`, as the Confluent serializers write them.
pub(crate) fn put_message_indexes(out: &mut Vec<u8>, path: &[usize]) {
    if path == [0] {
        out.push(0);
        return;
    }
    put_varint(out, zigzag_encode(path.len() as i64));
    for &i in path {
        put_varint(out, zigzag_encode(i as i64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_zigzags_and_message_indexes_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            let mut b = vec![];
            put_varint(&mut b, v);
            assert_eq!(Reader::new(&b).varint(), Ok(v));
        }
        for n in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(zigzag_decode(zigzag_encode(n)), n);
        }
        for path in [vec![0], vec![1], vec![2, 0, 3]] {
            let mut b = vec![];
            put_message_indexes(&mut b, &path);
            b.push(0xAA);
            assert_eq!(message_indexes(&b), Ok((path, &[0xAAu8][..])));
        }
        assert!(Reader::new(&[0x80]).varint().is_err());
        assert!(Reader::new(&[2, 1]).len_delimited().is_err());
    }
}
