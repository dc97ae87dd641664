//! ROCA (CVE-2017-15361): RSA keys made by Infineon's RSALib (TPM firmware
//! before the 2017 fixes) have primes of the form k·M + (65537^a mod M), so
//! their modulus is, modulo every small prime p, a power of 65537. The
//! published fingerprint (crocs-muni/roca, `detect.py`) tests exactly that
//! for the primes 3 to 167; a random modulus passes with negligible
//! probability, and such a key can be factored: an EK with it proves
//! nothing.

/// The primes of the published fingerprint.
const PRIMES: [u32; 38] = [
    3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
    101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167,
];

/// Whether the big-endian RSA `modulus` has the ROCA fingerprint.
pub fn has_roca_fingerprint(modulus: &[u8]) -> bool {
    if modulus.iter().all(|&b| b == 0) {
        return false;
    }
    PRIMES.iter().all(|&p| {
        let r = modulus
            .iter()
            .fold(0u32, |acc, &b| (acc * 256 + u32::from(b)) % p);
        in_subgroup_of_65537(r, p)
    })
}

/// Whether `r` is a power of 65537 modulo the prime `p`.
fn in_subgroup_of_65537(r: u32, p: u32) -> bool {
    let g = 65_537 % p;
    let mut x = 1 % p;
    for _ in 0..p {
        if x == r {
            return true;
        }
        x = x * g % p;
        if x == 1 {
            return false;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 65537^k as big-endian bytes: a power of 65537 modulo every prime.
    fn power_of_65537(k: u32) -> Vec<u8> {
        let mut n = vec![1u8];
        for _ in 0..k {
            let mut carry = 0u64;
            for b in n.iter_mut().rev() {
                let v = u64::from(*b) * 65_537 + carry;
                *b = v as u8;
                carry = v >> 8;
            }
            while carry > 0 {
                n.insert(0, carry as u8);
                carry >>= 8;
            }
        }
        n
    }

    #[test]
    fn the_published_masks() {
        // detect.py's first prints: bit r set when r is a power of 65537 mod p.
        let mask = |p: u32| {
            (0..p).fold(0u64, |m, r| {
                m | (u64::from(in_subgroup_of_65537(r, p)) << r)
            })
        };
        assert_eq!(mask(3), 6);
        assert_eq!(mask(5), 30);
        assert_eq!(mask(7), 126);
        assert_eq!(mask(11), 1026);
        assert_eq!(mask(13), 5658);
        assert_eq!(mask(17), 107_286);
        assert_eq!(mask(19), 199_410);
        assert_eq!(mask(23), 8_388_606);
        assert_eq!(mask(29), 536_870_910);
        assert_eq!(mask(31), 2_147_483_646);
        assert_eq!(mask(37), 67_109_890);
    }

    #[test]
    fn fingerprinted_and_clean_moduli() {
        let weak = power_of_65537(128); // 2049 bits
        assert!(weak.len() >= 256);
        assert!(has_roca_fingerprint(&weak));
        let mut leading_zero = vec![0];
        leading_zero.extend_from_slice(&weak);
        assert!(has_roca_fingerprint(&leading_zero));
        // One bit off: no longer a power of 65537 modulo some small prime.
        let mut other = weak.clone();
        *other.last_mut().unwrap() ^= 0x02;
        assert!(!has_roca_fingerprint(&other));
        assert!(!has_roca_fingerprint(&[0; 256]));
        assert!(!has_roca_fingerprint(&[]));
    }
}
