//! A compact set of identifiers that were used once and must be refused if
//! they come again (replay protection, SR-9), for as long as a Domain (or
//! a whole journal) lives.
//!
//! Each identifier is kept as a 128-bit digest (the first 16 bytes of the
//! SHA-256 of a kind tag and the identifier), not as its text: **16 bytes
//! per identifier, 16 MiB per million**, plus a buffer of the most recent
//! √n digests (16 KiB at a million). The digests live in one sorted vector
//! (binary search) and a small unsorted buffer that is merged into it when
//! it reaches √n entries, so an insertion costs O(√n) amortised moves and a
//! lookup O(log n + √n) comparisons: flat in practice.
//!
//! A digest collision can only make a *fresh* identifier look used (it is
//! then refused), never let a used one through: what the set answers
//! "absent" was certainly never inserted. Two random identifiers collide
//! with probability 2⁻¹²⁸, and finding a collision on purpose takes about
//! 2⁶⁴ SHA-256 computations, for nothing more than having one's own new
//! identifier refused.

use sha2::{Digest, Sha256};

/// Fewest entries the unsorted buffer holds before it is merged.
const MIN_BUFFER: usize = 256;

/// A set of identifier digests (see the module documentation for its cost).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdDigestSet {
    /// Sorted, without duplicates.
    sorted: Vec<u128>,
    /// Recently inserted digests, unsorted; none of them is in `sorted`.
    recent: Vec<u128>,
}

impl IdDigestSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The digest of identifier `id` of kind `kind`. The kind keeps, for
    /// example, a Session ID and a request ID with the same text apart.
    pub fn digest(kind: &str, id: &str) -> u128 {
        let mut hasher = Sha256::new();
        // Length-prefixed, so that (kind, id) pairs cannot run into each other.
        hasher.update((kind.len() as u64).to_le_bytes());
        hasher.update(kind.as_bytes());
        hasher.update(id.as_bytes());
        let full = hasher.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&full[..16]);
        u128::from_le_bytes(first)
    }

    /// Whether `id` of `kind` was inserted.
    pub fn contains(&self, kind: &str, id: &str) -> bool {
        self.contains_digest(Self::digest(kind, id))
    }

    /// Inserts `id` of `kind`; false if it was there already.
    pub fn insert(&mut self, kind: &str, id: &str) -> bool {
        self.insert_digest(Self::digest(kind, id))
    }

    /// Whether `digest` was inserted.
    pub fn contains_digest(&self, digest: u128) -> bool {
        self.sorted.binary_search(&digest).is_ok() || self.recent.contains(&digest)
    }

    /// Inserts `digest`; false if it was there already.
    pub fn insert_digest(&mut self, digest: u128) -> bool {
        if self.contains_digest(digest) {
            return false;
        }
        self.recent.push(digest);
        if self.recent.len() >= self.buffer_limit() {
            self.merge_recent();
        }
        true
    }

    /// How many digests the set holds.
    pub fn len(&self) -> usize {
        self.sorted.len() + self.recent.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// √n, at least [`MIN_BUFFER`]: merging costs O(n), so merging every √n
    /// insertions keeps both the merge and the buffer's linear scan at √n.
    fn buffer_limit(&self) -> usize {
        self.sorted.len().isqrt().max(MIN_BUFFER)
    }

    /// Moves the buffer into the sorted vector: a merge from the back, in
    /// place, into exactly the room needed (no doubling slack).
    fn merge_recent(&mut self) {
        self.recent.sort_unstable();
        let old_len = self.sorted.len();
        self.sorted.reserve_exact(self.recent.len());
        self.sorted.resize(old_len + self.recent.len(), 0);
        let (mut from_sorted, mut from_recent, mut to) = (old_len, self.recent.len(), self.sorted.len());
        while from_recent > 0 {
            to -= 1;
            if from_sorted > 0 && self.sorted[from_sorted - 1] > self.recent[from_recent - 1] {
                from_sorted -= 1;
                self.sorted[to] = self.sorted[from_sorted];
            } else {
                from_recent -= 1;
                self.sorted[to] = self.recent[from_recent];
            }
        }
        self.recent.clear();
        // The buffer's own allocation stays at most √n digests.
        self.recent.shrink_to(self.buffer_limit());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inserted_id_is_contained_and_a_second_insert_is_refused() {
        let mut set = IdDigestSet::new();
        assert!(!set.contains("request", "r1"));
        assert!(set.insert("request", "r1"));
        assert!(set.contains("request", "r1"));
        assert!(!set.insert("request", "r1"));
        assert!(!set.contains("session", "r1"), "kinds are kept apart");
        assert!(!set.contains("request", "r2"));
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn ids_stay_members_across_merges_and_absent_ones_stay_absent() {
        let mut set = IdDigestSet::new();
        for i in 0..20_000 {
            assert!(set.insert("request", &format!("req-{i}")), "req-{i} fresh");
        }
        assert_eq!(set.len(), 20_000);
        assert!(set.recent.len() < set.buffer_limit(), "the buffer was merged");
        assert!(set.sorted.windows(2).all(|w| w[0] < w[1]), "sorted without duplicates");
        for i in 0..20_000 {
            assert!(set.contains("request", &format!("req-{i}")), "req-{i} kept");
            assert!(!set.insert("request", &format!("req-{i}")), "req-{i} refused again");
        }
        for i in 20_000..21_000 {
            assert!(!set.contains("request", &format!("req-{i}")));
        }
        // 16 bytes a digest, no doubling slack once merged.
        assert!(set.sorted.capacity() * 16 <= 20_000 * 16 + 16 * set.buffer_limit(), "{}", set.sorted.capacity());
    }
}
