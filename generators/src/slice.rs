//! Which part of a stream one generator instance produces.

use crate::error::{GeneratorError, Result};

/// Which part of the stream one generator instance produces: the event numbers `n`
/// with `n % count == index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Slice {
    pub index: u32,
    pub count: u32,
}

impl Slice {
    /// The whole stream.
    pub const WHOLE: Slice = Slice { index: 0, count: 1 };

    pub fn new(index: u32, count: u32) -> Result<Self> {
        if count == 0 || index >= count {
            return Err(GeneratorError::InvalidConfig(format!(
                "slice {index} of {count}: need index < count"
            )));
        }
        Ok(Slice { index, count })
    }

    /// The event number of this slice's `k`-th event.
    pub fn event_number(&self, k: u64) -> u64 {
        u64::from(self.index) + k * u64::from(self.count)
    }

    /// Whether event number `n` belongs to this slice.
    pub fn contains(&self, n: u64) -> bool {
        n % u64::from(self.count) == u64::from(self.index)
    }

    /// How many of the event numbers `0 .. total` belong to this slice.
    pub fn len_of(&self, total: u64) -> u64 {
        let (index, count) = (u64::from(self.index), u64::from(self.count));
        if total <= index {
            0
        } else {
            (total - index).div_ceil(count)
        }
    }
}
