//! IP prefixes (CIDR) as written in egress rules.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// An IPv4 or IPv6 network prefix such as `10.222.0.0/16`.
///
/// The address never has host bits set. `origin` records where the prefix was
/// written (`FILE:LINE:COLUMN`) so later stages (the policy compiler) can point
/// at it; it takes no part in equality, ordering, hashing or serialisation.
#[derive(Debug, Clone)]
pub struct IpPrefix {
    network: IpAddr,
    length: u8,
    /// Where the prefix was written, `FILE:LINE:COLUMN` (empty when parsed
    /// from a plain string).
    pub origin: String,
}

/// Why a string is not an acceptable prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// No `/LENGTH` part.
    #[error("{0:?} has no prefix length")]
    MissingLength(String),
    /// The address part does not parse.
    #[error("{0:?} is not an IPv4 or IPv6 address")]
    BadAddress(String),
    /// The length is not a number in range for the family.
    #[error("prefix length {length:?} is not valid for {family} (0..={max})")]
    BadLength {
        /// The length as written.
        length: String,
        /// "IPv4" or "IPv6".
        family: &'static str,
        /// The largest valid length.
        max: u8,
    },
    /// Bits beyond the prefix length are set.
    #[error("{written} has host bits set")]
    HostBitsSet {
        /// The prefix as written.
        written: String,
        /// The network the author probably meant.
        network: String,
    },
}

impl PrefixError {
    /// A suggestion for fixing the prefix.
    pub fn hint(&self) -> String {
        match self {
            PrefixError::MissingLength(s) => {
                let length = if s.contains(':') { 128 } else { 32 };
                format!(
                    "write the prefix length explicitly, e.g. \"{s}/{length}\" for a single host"
                )
            }
            PrefixError::BadAddress(_) => {
                "use CIDR notation such as \"10.222.0.0/16\" or \"fd00::/8\"".to_string()
            }
            PrefixError::BadLength { max, .. } => format!("use a length between 0 and {max}"),
            PrefixError::HostBitsSet { network, .. } => format!("did you mean \"{network}\"?"),
        }
    }
}

impl IpPrefix {
    /// Builds a prefix from a network address and a length, rejecting host bits.
    pub fn new(address: IpAddr, length: u8) -> Result<Self, PrefixError> {
        let max = max_length(&address);
        if length > max {
            return Err(PrefixError::BadLength {
                length: length.to_string(),
                family: family_name(&address),
                max,
            });
        }
        let network = mask(address, length);
        if network != address {
            return Err(PrefixError::HostBitsSet {
                written: format!("{address}/{length}"),
                network: format!("{network}/{length}"),
            });
        }
        Ok(Self {
            network,
            length,
            origin: String::new(),
        })
    }

    /// The network address (host bits are zero).
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn length(&self) -> u8 {
        self.length
    }

    /// True for an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// True when `address` lies inside this prefix.
    pub fn contains(&self, address: IpAddr) -> bool {
        address.is_ipv4() == self.network.is_ipv4() && mask(address, self.length) == self.network
    }
}

fn max_length(address: &IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

fn family_name(address: &IpAddr) -> &'static str {
    if address.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn mask(address: IpAddr, length: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = if length == 0 {
                0
            } else {
                bits & (u32::MAX << (32 - u32::from(length)))
            };
            IpAddr::V4(Ipv4Addr::from(kept))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = if length == 0 {
                0
            } else {
                bits & (u128::MAX << (128 - u32::from(length)))
            };
            IpAddr::V6(Ipv6Addr::from(kept))
        }
    }
}

impl FromStr for IpPrefix {
    type Err = PrefixError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let Some((address, length)) = text.split_once('/') else {
            return match text.parse::<IpAddr>() {
                Ok(_) => Err(PrefixError::MissingLength(text.to_string())),
                Err(_) => Err(PrefixError::BadAddress(text.to_string())),
            };
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| PrefixError::BadAddress(address.to_string()))?;
        let max = max_length(&address);
        // Only plain decimal digits: "+8" or " 8" would be accepted by parse().
        let parsed = if !length.is_empty()
            && length.len() <= 3
            && length.bytes().all(|b| b.is_ascii_digit())
        {
            length.parse::<u8>().ok().filter(|l| *l <= max)
        } else {
            None
        };
        let Some(parsed) = parsed else {
            return Err(PrefixError::BadLength {
                length: length.to_string(),
                family: family_name(&address),
                max,
            });
        };
        IpPrefix::new(address, parsed)
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.length)
    }
}

impl PartialEq for IpPrefix {
    fn eq(&self, other: &Self) -> bool {
        self.network == other.network && self.length == other.length
    }
}

impl Eq for IpPrefix {}

impl Hash for IpPrefix {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.network.hash(state);
        self.length.hash(state);
    }
}

impl PartialOrd for IpPrefix {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for IpPrefix {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.network, self.length).cmp(&(other.network, other.length))
    }
}

impl Serialize for IpPrefix {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6() {
        let p: IpPrefix = "10.222.0.0/16".parse().unwrap();
        assert_eq!(p.length(), 16);
        assert!(p.is_ipv4());
        assert!(p.contains("10.222.3.4".parse().unwrap()));
        assert!(!p.contains("10.223.0.1".parse().unwrap()));
        let q: IpPrefix = "fd00::/8".parse().unwrap();
        assert!(!q.is_ipv4());
        assert_eq!(q.to_string(), "fd00::/8");
        let all: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
    }

    #[test]
    fn rejects_bad_prefixes_with_hints() {
        match "10.0.0.1/8".parse::<IpPrefix>() {
            Err(e @ PrefixError::HostBitsSet { .. }) => assert!(e.hint().contains("10.0.0.0/8")),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            "10.0.0.1".parse::<IpPrefix>(),
            Err(PrefixError::MissingLength(_))
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<IpPrefix>(),
            Err(PrefixError::BadLength { .. })
        ));
        assert!(matches!(
            "10.0.0.0/+8".parse::<IpPrefix>(),
            Err(PrefixError::BadLength { .. })
        ));
        assert!(matches!(
            "fd00::/129".parse::<IpPrefix>(),
            Err(PrefixError::BadLength { .. })
        ));
        assert!(matches!(
            "10.0.0/8".parse::<IpPrefix>(),
            Err(PrefixError::BadAddress(_))
        ));
        assert!(matches!(
            "fd00::1/64".parse::<IpPrefix>(),
            Err(PrefixError::HostBitsSet { .. })
        ));
    }

    #[test]
    fn equality_ignores_origin() {
        let mut a: IpPrefix = "10.0.0.0/8".parse().unwrap();
        let b: IpPrefix = "10.0.0.0/8".parse().unwrap();
        a.origin = "x:1:1".into();
        assert_eq!(a, b);
    }
}
