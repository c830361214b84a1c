//! Random identifiers (Session IDs, container IDs) from the kernel's CSPRNG.
//! A failure to read randomness is an error, never a predictable ID.

use std::io::Read;

/// `n` random bytes as lowercase hex.
pub fn hex(n: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex::encode(buf))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_have_the_asked_length_and_differ() {
        let a = super::hex(8).expect("random");
        let b = super::hex(8).expect("random");
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
