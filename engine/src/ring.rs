//! Consistent-hash ring that maps a partition number to a member of a
//! function group. Every upstream instance computes the same mapping, so
//! partition `i` from all of them meets at one member. Virtual nodes keep
//! the load even; growing the group moves only about 1/n of the partitions.

use sha2::{Digest, Sha256};

const VIRTUAL_NODES: u32 = 64;

/// The consistent-hash ring that assigns hash partitions to the members of a group.
#[derive(Debug, Clone)]
pub struct HashRing {
    /// (point on the ring, member), sorted by point.
    points: Vec<(u64, usize)>,
    members: usize,
}

fn point(bytes: &[u8]) -> u64 {
    let digest = Sha256::digest(bytes);
    u64::from_be_bytes(digest[..8].try_into().expect("sha256 has 32 bytes"))
}

impl HashRing {
    /// A ring over `members` members.
    pub fn new(members: usize) -> Self {
        let members = members.max(1);
        let mut points = Vec::with_capacity(members * VIRTUAL_NODES as usize);
        for m in 0..members {
            for v in 0..VIRTUAL_NODES {
                points.push((point(format!("member-{m}#{v}").as_bytes()), m));
            }
        }
        points.sort_unstable();
        HashRing { points, members }
    }

    /// How many members it has.
    pub fn members(&self) -> usize {
        self.members
    }

    /// The member that owns partition `partition`.
    pub fn member_for(&self, partition: usize) -> usize {
        let p = point(format!("partition-{partition}").as_bytes());
        let idx = self.points.partition_point(|(q, _)| *q < p);
        self.points[idx % self.points.len()].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let a = HashRing::new(8);
        let b = HashRing::new(8);
        for p in 0..100 {
            assert_eq!(a.member_for(p), b.member_for(p));
            assert!(a.member_for(p) < 8);
        }
    }

    #[test]
    fn growing_the_group_moves_few_partitions() {
        let small = HashRing::new(8);
        let big = HashRing::new(9);
        let moved = (0..10_000)
            .filter(|p| small.member_for(*p) != big.member_for(*p))
            .count();
        // Ideal is 1/9 of the keys; allow slack for hashing variance.
        assert!(moved < 2_000, "moved {moved} of 10000");
    }

    #[test]
    fn every_member_gets_work() {
        let ring = HashRing::new(8);
        let mut seen = [0usize; 8];
        for p in 0..1000 {
            seen[ring.member_for(p)] += 1;
        }
        assert!(seen.iter().all(|c| *c > 50), "{seen:?}");
    }
}
