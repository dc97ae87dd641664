//! Random bytes and identifiers (`node_…`, `tok_…`).

/// Random bytes from the operating system.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b)?;
    Ok(b)
}

/// `prefix` followed by 26 lowercase base32 characters (128 random bits),
/// which fits both node ids and token ids of the wire.
pub(crate) fn random_id(prefix: &str) -> Result<String, getrandom::Error> {
    let bytes: [u8; 16] = random_bytes()?;
    Ok(format!("{prefix}{}", base32_lower(&bytes)))
}

/// RFC 4648 base32 without padding, lowercase (a–z, 2–7).
fn base32_lower(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    let mut acc: u32 = 0;
    let mut bits = 0u32;
    for &b in data {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_vectors() {
        // RFC 4648 section 10, lowercased, unpadded.
        assert_eq!(base32_lower(b""), "");
        assert_eq!(base32_lower(b"f"), "my");
        assert_eq!(base32_lower(b"fo"), "mzxq");
        assert_eq!(base32_lower(b"foobar"), "mzxw6ytboi");
    }

    #[test]
    fn ids_are_valid_on_the_wire() {
        let n = random_id("node_").unwrap();
        assert_eq!(n.len(), 5 + 26);
        bc_wire::spiffe::check_node_id(&n).unwrap();
        let t = random_id("tok_").unwrap();
        let token = bc_wire::token::JoinToken {
            id: t.clone(),
            secret: [7; 32],
        };
        assert_eq!(
            bc_wire::token::JoinToken::parse(&token.expose())
                .unwrap()
                .id,
            t
        );
    }
}
