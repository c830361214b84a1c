//! IP prefixes (CIDR) as written in egress rules and address pools.
//!
//! The type and its parser are `lazaret_netpolicy::Prefix` (no host bits, no
//! garbage); this module only words its errors as configuration diagnostics.

use std::net::IpAddr;

use lazaret_netpolicy::PrefixError;

/// The diagnostic (message, hint) for `text`, which `Prefix::from_str`
/// refused with `error`.
pub(crate) fn describe(text: &str, error: &PrefixError) -> (String, String) {
    match error {
        PrefixError::Malformed { .. } if text.parse::<IpAddr>().is_ok() => {
            let length = if text.contains(':') { 128 } else { 32 };
            (
                format!("{text:?} has no prefix length"),
                format!("write the prefix length explicitly, e.g. \"{text}/{length}\" for a single host"),
            )
        }
        PrefixError::Malformed { .. } => bad_address(text),
        PrefixError::BadAddress { address, .. } => bad_address(address),
        PrefixError::BadLength { max, .. } => {
            let length = text.split_once('/').map_or("", |(_, length)| length);
            let family = if *max == 32 { "IPv4" } else { "IPv6" };
            (format!("prefix length {length:?} is not valid for {family} (0..={max})"), format!("use a length between 0 and {max}"))
        }
        PrefixError::HostBitsSet { suggestion, .. } => {
            // The address and length as read, e.g. `10.222.0.1/16`.
            let written = text
                .split_once('/')
                .and_then(|(address, _)| address.parse::<IpAddr>().ok())
                .map_or_else(|| text.to_string(), |address| format!("{address}/{}", suggestion.prefix_len()));
            (format!("{written} has host bits set"), format!("did you mean \"{suggestion}\"?"))
        }
    }
}

fn bad_address(address: &str) -> (String, String) {
    (format!("{address:?} is not an IPv4 or IPv6 address"), "use CIDR notation such as \"10.222.0.0/16\" or \"fd00::/8\"".to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use lazaret_netpolicy::Prefix;

    use super::*;
    use crate::config::Located;

    fn problem(text: &str) -> (String, String) {
        let error = text.parse::<Prefix>().unwrap_err();
        describe(text, &error)
    }

    #[test]
    fn parses_v4_and_v6() {
        let p: Prefix = "10.222.0.0/16".parse().unwrap();
        assert_eq!(p.prefix_len(), 16);
        assert!(p.is_v4());
        assert!(p.contains("10.222.3.4".parse().unwrap()));
        assert!(!p.contains("10.223.0.1".parse().unwrap()));
        let q: Prefix = "fd00::/8".parse().unwrap();
        assert!(!q.is_v4());
        assert_eq!(q.to_string(), "fd00::/8");
        let all: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
    }

    #[test]
    fn rejects_bad_prefixes_with_hints() {
        let (message, hint) = problem("10.0.0.1/8");
        assert_eq!(message, "10.0.0.1/8 has host bits set");
        assert!(hint.contains("10.0.0.0/8"), "{hint}");
        // The address as read, not as written.
        assert_eq!(problem("fd00:0::1/64").0, "fd00::1/64 has host bits set");
        assert_eq!(
            problem("10.0.0.1"),
            (
                "\"10.0.0.1\" has no prefix length".to_string(),
                "write the prefix length explicitly, e.g. \"10.0.0.1/32\" for a single host".to_string()
            )
        );
        assert!(problem("fd00::1").1.contains("\"fd00::1/128\""));
        assert_eq!(problem("10.0.0.0/33").0, "prefix length \"33\" is not valid for IPv4 (0..=32)");
        assert_eq!(problem("10.0.0.0/+8").0, "prefix length \"+8\" is not valid for IPv4 (0..=32)");
        assert_eq!(
            problem("fd00::/129"),
            ("prefix length \"129\" is not valid for IPv6 (0..=128)".to_string(), "use a length between 0 and 128".to_string())
        );
        assert_eq!(problem("10.0.0/8").0, "\"10.0.0\" is not an IPv4 or IPv6 address");
        assert_eq!(problem("example.com").0, "\"example.com\" is not an IPv4 or IPv6 address");
        assert_eq!(problem("fd00::1/64").0, "fd00::1/64 has host bits set");
    }

    #[test]
    fn equality_ignores_origin() {
        let a = Located::new("10.0.0.0/8".parse::<Prefix>().unwrap(), "x:1:1");
        let b = Located::new("10.0.0.0/8".parse::<Prefix>().unwrap(), "");
        assert_eq!(a, b);
    }
}
