//! Configuration values together with where they were written.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use serde::{Serialize, Serializer};

/// A value read from the configuration and the place it was written, so that
/// later stages (the policy compiler, error messages) can point at it.
///
/// The value is the shared vocabulary type (e.g. `lazaret_netpolicy::Prefix`,
/// `lazaret_mounts::volumes::Volume`); reading a `Located<T>` reads through to
/// it. Only the value takes part in equality, ordering, hashing, display and
/// serialisation (as its display form): `origin` is presentation.
#[derive(Debug, Clone)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Where it was written, `FILE:LINE:COLUMN`.
    pub origin: String,
}

impl<T> Located<T> {
    /// `value`, written at `origin` (`FILE:LINE:COLUMN`).
    pub fn new(value: T, origin: impl Into<String>) -> Self {
        Self { value, origin: origin.into() }
    }
}

impl<T> Deref for Located<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: PartialEq> PartialEq for Located<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Located<T> {}

impl<T: Hash> Hash for Located<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl<T: PartialOrd> PartialOrd for Located<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.value.partial_cmp(&other.value)
    }
}

impl<T: Ord> Ord for Located<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.value.cmp(&other.value)
    }
}

impl<T: fmt::Display> fmt::Display for Located<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: fmt::Display> Serialize for Located<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.value)
    }
}
