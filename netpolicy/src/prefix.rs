//! IP prefixes (CIDR blocks) with strict parsing: no host bits, no garbage.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why a CIDR string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// The text is not `ADDRESS/LENGTH`.
    #[error("`{text}` is not a CIDR prefix (expected ADDRESS/LENGTH, e.g. 10.1.0.0/16 or fd00::/8)")]
    Malformed {
        /// The rejected text.
        text: String,
    },
    /// The address part does not parse as IPv4 or IPv6.
    #[error("`{text}`: `{address}` is not an IPv4 or IPv6 address")]
    BadAddress {
        /// The rejected text.
        text: String,
        /// The address part.
        address: String,
    },
    /// The length is not a number in range for the family.
    #[error("`{text}`: prefix length must be a number from 0 to {max}")]
    BadLength {
        /// The rejected text.
        text: String,
        /// 32 for IPv4, 128 for IPv6.
        max: u8,
    },
    /// Bits beyond the prefix length are set.
    #[error("`{text}` has host bits set; did you mean `{suggestion}`?")]
    HostBitsSet {
        /// The rejected text.
        text: String,
        /// The same prefix with host bits cleared.
        suggestion: Prefix,
    },
}

/// An IPv4 or IPv6 network: an address with all host bits clear and a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    network: IpAddr,
    len: u8,
}

fn max_len(addr: &IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn to_bits(addr: &IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

fn mask(len: u8, max: u8) -> u128 {
    // Mask of `len` leading ones within a `max`-bit value.
    if len == 0 {
        return 0;
    }
    let all: u128 = if max == 128 { u128::MAX } else { (1u128 << max) - 1 };
    let host_mask = (1u128 << (max - len)) - 1; // max - len < 128 because len > 0
    all & !host_mask
}

fn from_bits(bits: u128, v4: bool) -> IpAddr {
    if v4 {
        // Callers only pass values that fit 32 bits for IPv4.
        IpAddr::V4(Ipv4Addr::from((bits & 0xffff_ffff) as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(bits))
    }
}

impl Prefix {
    /// Builds a prefix, refusing host bits and out-of-range lengths.
    pub fn new(network: IpAddr, len: u8) -> Result<Prefix, PrefixError> {
        let text = format!("{network}/{len}");
        let max = max_len(&network);
        if len > max {
            return Err(PrefixError::BadLength { text, max });
        }
        let truncated = Prefix::truncating(network, len);
        if truncated.network != network {
            return Err(PrefixError::HostBitsSet { text, suggestion: truncated });
        }
        Ok(truncated)
    }

    /// The prefix of length `len` containing `addr` (host bits cleared).
    /// `len` is clamped to the family's maximum.
    pub fn truncating(addr: IpAddr, len: u8) -> Prefix {
        let max = max_len(&addr);
        let len = len.min(max);
        let bits = to_bits(&addr) & mask(len, max);
        Prefix { network: from_bits(bits, addr.is_ipv4()), len }
    }

    /// The single-address prefix (/32 or /128) of `addr`.
    pub fn host(addr: IpAddr) -> Prefix {
        Prefix { network: addr, len: max_len(&addr) }
    }

    /// The whole address family: 0.0.0.0/0 or ::/0.
    pub fn any(v4: bool) -> Prefix {
        if v4 {
            Prefix { network: IpAddr::V4(Ipv4Addr::UNSPECIFIED), len: 0 }
        } else {
            Prefix { network: IpAddr::V6(Ipv6Addr::UNSPECIFIED), len: 0 }
        }
    }

    /// The network address (host bits clear).
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// True for IPv4 prefixes.
    pub fn is_v4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// True for a single-address prefix (/32, /128).
    pub fn is_host(&self) -> bool {
        self.len == max_len(&self.network)
    }

    /// Whether `addr` lies inside this prefix (always false across families).
    pub fn contains(&self, addr: IpAddr) -> bool {
        if addr.is_ipv4() != self.is_v4() {
            return false;
        }
        let max = max_len(&addr);
        to_bits(&addr) & mask(self.len, max) == to_bits(&self.network)
    }

    /// Whether `other` lies entirely inside this prefix.
    pub fn covers(&self, other: &Prefix) -> bool {
        other.len >= self.len && self.contains(other.network)
    }

    /// Whether the two prefixes share at least one address.
    pub fn overlaps(&self, other: &Prefix) -> bool {
        self.covers(other) || other.covers(self)
    }

    /// The `index`-th address of the prefix, if it lies inside it.
    pub fn nth(&self, index: u128) -> Option<IpAddr> {
        let max = max_len(&self.network);
        let size_bits = max - self.len;
        if size_bits < 128 && index >> size_bits != 0 {
            return None;
        }
        Some(from_bits(to_bits(&self.network) | index, self.is_v4()))
    }

    /// The `index`-th sub-prefix of length `len` inside this prefix.
    pub fn subnet(&self, len: u8, index: u128) -> Option<Prefix> {
        let max = max_len(&self.network);
        if len < self.len || len > max {
            return None;
        }
        let count_bits = len - self.len;
        if count_bits < 128 && index >> count_bits != 0 {
            return None;
        }
        let shift = max - len;
        let offset = if shift >= 128 { 0 } else { index << shift };
        Some(Prefix { network: from_bits(to_bits(&self.network) | offset, self.is_v4()), len })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.len)
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;

    fn from_str(text: &str) -> Result<Prefix, PrefixError> {
        let malformed = || PrefixError::Malformed { text: text.to_string() };
        let (address, length) = text.split_once('/').ok_or_else(malformed)?;
        let network: IpAddr =
            address.parse().map_err(|_| PrefixError::BadAddress { text: text.to_string(), address: address.to_string() })?;
        let max = max_len(&network);
        // Digits only: refuses "+8", " 8", "08x" and the like.
        if length.is_empty() || length.len() > 3 || !length.bytes().all(|b| b.is_ascii_digit()) {
            return Err(PrefixError::BadLength { text: text.to_string(), max });
        }
        let len: u8 = length.parse().map_err(|_| PrefixError::BadLength { text: text.to_string(), max })?;
        Prefix::new(network, len).map_err(|error| match error {
            PrefixError::HostBitsSet { suggestion, .. } => PrefixError::HostBitsSet { text: text.to_string(), suggestion },
            PrefixError::BadLength { max, .. } => PrefixError::BadLength { text: text.to_string(), max },
            other => other,
        })
    }
}

impl serde::Serialize for Prefix {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Prefix, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Prefix {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn parses_and_displays_round_trip() {
        for text in ["10.0.0.0/8", "0.0.0.0/0", "192.0.2.1/32", "::/0", "fd00::/8", "2001:db8::1/128"] {
            assert_eq!(p(text).to_string(), text);
        }
        assert_eq!(p("fe80:0::/10").to_string(), "fe80::/10");
    }

    #[test]
    fn rejects_host_bits_with_suggestion() {
        let error = "10.1.2.3/8".parse::<Prefix>().expect_err("must be rejected");
        assert_eq!(error, PrefixError::HostBitsSet { text: "10.1.2.3/8".into(), suggestion: p("10.0.0.0/8") });
        assert!(error.to_string().contains("did you mean `10.0.0.0/8`"));
        assert!(matches!("fd00::1/8".parse::<Prefix>(), Err(PrefixError::HostBitsSet { .. })));
        assert!(matches!("0.0.0.1/0".parse::<Prefix>(), Err(PrefixError::HostBitsSet { .. })));
    }

    #[test]
    fn rejects_garbage_and_bad_lengths() {
        for text in ["", "10.0.0.0", "/8", "10.0.0/8", "example.com/8", "10.0.0.0/8/8"] {
            let error = text.parse::<Prefix>().expect_err("must be rejected");
            assert!(
                matches!(error, PrefixError::Malformed { .. } | PrefixError::BadAddress { .. } | PrefixError::BadLength { .. }),
                "{text}: {error:?}"
            );
        }
        for text in ["10.0.0.0/33", "10.0.0.0/", "10.0.0.0/+8", "10.0.0.0/ 8", "::/129", "10.0.0.0/-1", "10.0.0.0/0008"] {
            assert!(matches!(text.parse::<Prefix>(), Err(PrefixError::BadLength { .. })), "{text}");
        }
    }

    #[test]
    fn containment() {
        let rfc = p("172.16.0.0/12");
        assert!(rfc.contains("172.31.255.255".parse().expect("valid test input")));
        assert!(!rfc.contains("172.32.0.0".parse().expect("valid test input")));
        assert!(!rfc.contains("::ffff:172.16.0.1".parse().expect("valid test input")));
        assert!(Prefix::any(true).contains("8.8.8.8".parse().expect("valid test input")));
        assert!(!Prefix::any(true).contains("::1".parse().expect("valid test input")));
        assert!(Prefix::any(false).contains("2001:db8::1".parse().expect("valid test input")));
        assert!(p("fc00::/7").contains("fdff::1".parse().expect("valid test input")));
        assert!(!p("fc00::/7").contains("fe00::1".parse().expect("valid test input")));
        assert!(p("10.0.0.0/8").covers(&p("10.2.0.0/16")));
        assert!(!p("10.2.0.0/16").covers(&p("10.0.0.0/8")));
        assert!(p("10.2.0.0/16").overlaps(&p("10.0.0.0/8")));
        assert!(!p("10.2.0.0/16").overlaps(&p("10.3.0.0/16")));
    }

    #[test]
    fn subnets_and_addresses() {
        let pool = p("100.96.0.0/16");
        assert_eq!(pool.subnet(30, 0), Some(p("100.96.0.0/30")));
        assert_eq!(pool.subnet(30, 3), Some(p("100.96.0.12/30")));
        assert_eq!(pool.subnet(30, 16384), None);
        assert_eq!(p("100.96.0.4/30").nth(3), Some("100.96.0.7".parse().expect("valid test input")));
        assert_eq!(p("100.96.0.4/30").nth(4), None);
        assert_eq!(Prefix::truncating("10.9.8.7".parse().expect("valid test input"), 8), p("10.0.0.0/8"));
        assert_eq!(Prefix::host("::1".parse().expect("valid test input")).to_string(), "::1/128");
    }
}
