//! A small, fixed pseudo-random generator.
//!
//! We keep our own generator instead of `rand`'s `SmallRng` because the streams must
//! stay byte-identical across dependency upgrades: benchmark inputs and ground-truth
//! files are compared between runs and machines. The algorithm is wyrand (fast, passes
//! BigCrush); seeding goes through the SplitMix64 finalizer.

/// SplitMix64's finalizer: a bijection on u64 that spreads every input bit.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Deterministic random numbers for one item (an event, a UUID, a URL).
///
/// Every item gets its own generator derived from (seed, stream, index), so any item can
/// be produced without producing the ones before it: this is what lets N instances split
/// a stream and still produce exactly the single-instance events.
#[derive(Debug, Clone)]
pub(crate) struct ItemRng {
    state: u64,
}

impl ItemRng {
    /// The generator of item `index` in `stream` (a constant naming what is generated).
    pub(crate) fn new(seed: u64, stream: u64, index: u64) -> Self {
        let base = mix64(seed ^ mix64(stream));
        ItemRng {
            state: mix64(base.wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15))),
        }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.state) * u128::from(self.state ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in `[0, n)`; `n` must be positive. Multiply-shift: no division, and the
    /// bias for the small ranges used here is below 2^-40.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `1 / n` (n >= 1); the reference generators phrase their
    /// "hot" choices as `nextInt(n) > 0`, the complement of this.
    pub(crate) fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = ItemRng::new(7, 1, 2);
        let mut seen = [false; 13];
        for _ in 0..10_000 {
            let v = rng.below(13) as usize;
            seen[v] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn different_indices_give_different_streams() {
        let a = ItemRng::new(1, 1, 0).next_u64();
        let b = ItemRng::new(1, 1, 1).next_u64();
        let c = ItemRng::new(2, 1, 0).next_u64();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }
}
