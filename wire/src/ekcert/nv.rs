//! EK certificates as TPMs hold them in NV: the DER, sometimes behind the
//! TCG PC Client header (`10 01 00` and a 2-byte length), often in an index
//! larger than the certificate, the rest padding (STMicro's ST33 holds its
//! 1,169-byte RSA EK certificate in a 1,600-byte index filled with 0xFF).
//!
//! bcd cuts the certificate out of what it reads ([`der_prefix`]); the
//! control plane accepts a certificate followed by 0xFF padding only
//! ([`without_padding`]), what an agent that sends NV as it reads it sends.

/// The DER SEQUENCE at the start of `raw` (after a TCG header, if any),
/// whatever follows it; None when `raw` does not start with one.
pub fn der_prefix(raw: &[u8]) -> Option<&[u8]> {
    let raw = match raw {
        [0x10, 0x01, 0x00, hi, lo, rest @ ..] => {
            rest.get(..usize::from(*hi) << 8 | usize::from(*lo))?
        }
        _ => raw,
    };
    if raw.len() < 2 || raw[0] != 0x30 {
        return None;
    }
    let (len, header) = match raw[1] {
        n if n < 0x80 => (usize::from(n), 2),
        0x81 => (usize::from(*raw.get(2)?), 3),
        0x82 => (
            usize::from(*raw.get(2)?) << 8 | usize::from(*raw.get(3)?),
            4,
        ),
        _ => return None,
    };
    raw.get(..header + len)
}

/// `bytes` without the 0xFF padding after the DER SEQUENCE it starts
/// with: `bytes` itself when nothing follows the DER, None when anything
/// but 0xFF does.
pub fn without_padding(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.first() != Some(&0x30) {
        return None;
    }
    let der = der_prefix(bytes)?;
    bytes[der.len()..].iter().all(|&b| b == 0xff).then_some(der)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ekcert::real;

    #[test]
    fn the_real_padded_nv_content() {
        let nv = real::der("stm-st33htph-rsa-ek-intca05-nvpadded.der");
        let der = real::der("stm-st33htph-rsa-ek-intca05.pem");
        assert_eq!((nv.len(), der.len()), (1600, 1169));
        assert_eq!(der_prefix(&nv), Some(der.as_slice()));
        assert_eq!(without_padding(&nv), Some(der.as_slice()));
        assert_eq!(without_padding(&der), Some(der.as_slice()));
        // Behind the TCG header.
        let mut wrapped = vec![0x10, 0x01, 0x00, (der.len() >> 8) as u8, der.len() as u8];
        wrapped.extend_from_slice(&der);
        wrapped.extend_from_slice(&[0xff; 9]);
        assert_eq!(der_prefix(&wrapped), Some(der.as_slice()));
        // The control plane takes no header and no other trailing bytes.
        assert_eq!(without_padding(&wrapped), None);
        let mut zeros = der.clone();
        zeros.push(0);
        assert_eq!(without_padding(&zeros), None);
        let mut mixed = nv.clone();
        mixed[1500] = 0;
        assert_eq!(without_padding(&mixed), None);
        // Cut short.
        assert_eq!(der_prefix(&der[..1000]), None);
        assert_eq!(der_prefix(&[0x10, 0x01, 0x00, 0x00, 0x09, 0x30]), None);
        assert_eq!(der_prefix(&[]), None);
        assert_eq!(der_prefix(&[0xff; 16]), None);
    }
}
