//! The cache of a lookup join: answers (found or not) by key, each used for
//! a TTL, at most `capacity` keys, the oldest answer evicted first.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::LookupRow;

/// Rows fetched from a lookup table, by key, each kept for a time to live;
/// past the capacity the oldest answers go first.
#[derive(Debug)]
pub struct LookupCache {
    capacity: usize,
    ttl: Duration,
    entries: HashMap<String, (Instant, Option<LookupRow>)>,
    /// Keys in the order their answers came; an entry whose time no longer
    /// matches was answered again later and is skipped.
    order: VecDeque<(Instant, String)>,
}

impl LookupCache {
    /// A cache of at most `capacity` keys, each kept for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        LookupCache {
            capacity,
            ttl,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The cached answer for `key`, unless it is older than the TTL.
    pub fn get(&self, key: &str, now: Instant) -> Option<&Option<LookupRow>> {
        let (at, row) = self.entries.get(key)?;
        (now.saturating_duration_since(*at) < self.ttl).then_some(row)
    }

    /// Remember `row` (or its absence) for `key`, as of `now`.
    pub fn insert(&mut self, key: String, row: Option<LookupRow>, now: Instant) {
        if self.capacity == 0 || self.ttl.is_zero() {
            return;
        }
        self.order.push_back((now, key.clone()));
        self.entries.insert(key, (now, row));
        while self.entries.len() > self.capacity {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&key).is_some_and(|(t, _)| *t == at) {
                self.entries.remove(&key);
            }
        }
        // Keys answered again leave stale places behind: drop them before
        // they outnumber the entries.
        if self.order.len() > 2 * self.capacity.max(16) {
            let entries = &self.entries;
            self.order
                .retain(|(at, k)| entries.get(k).is_some_and(|(t, _)| t == at));
        }
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(v: &str) -> Option<LookupRow> {
        Some(vec![Some(v.to_string())])
    }

    #[test]
    fn answers_expire_and_the_oldest_go_first() {
        let t0 = Instant::now();
        let mut c = LookupCache::new(2, Duration::from_secs(10));
        c.insert("a".into(), row("1"), t0);
        c.insert("b".into(), None, t0 + Duration::from_secs(1));
        assert_eq!(c.get("a", t0 + Duration::from_secs(5)), Some(&row("1")));
        // A miss is an answer too.
        assert_eq!(c.get("b", t0 + Duration::from_secs(5)), Some(&None));
        assert_eq!(c.get("a", t0 + Duration::from_secs(10)), None, "expired");
        c.insert("c".into(), row("3"), t0 + Duration::from_secs(2));
        assert_eq!(c.len(), 2);
        assert_eq!(c.get("a", t0 + Duration::from_secs(3)), None, "evicted");
        // Answered again: its new time counts, not its first place.
        c.insert("b".into(), row("2"), t0 + Duration::from_secs(3));
        c.insert("d".into(), row("4"), t0 + Duration::from_secs(4));
        assert!(c.get("b", t0 + Duration::from_secs(4)).is_some());
        assert!(c.get("c", t0 + Duration::from_secs(4)).is_none());
        for i in 0..1000 {
            c.insert("b".into(), row("2"), t0 + Duration::from_millis(5000 + i));
        }
        assert!(c.order.len() <= 2 * 16 + 1);
        let mut off = LookupCache::new(0, Duration::from_secs(1));
        off.insert("a".into(), row("1"), t0);
        assert!(off.is_empty());
    }
}
