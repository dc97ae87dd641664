//! BER to DER, for the CMS messages signers stream (OpenSSL's `-stream`,
//! AWS's `rsa2048`): indefinite lengths become definite, and a constructed
//! OCTET STRING (the content in chunks) becomes one primitive string. The
//! `der` crate's own BER mode leaves a chunked string's chunk headers in its
//! value, so the message is normalized first and then parsed as DER.
//!
//! Only what CMS uses: low tag numbers, lengths up to 4 bytes, nesting up
//! to [`MAX_DEPTH`]. The output is never longer than the input.

const MAX_DEPTH: usize = 32;
const CONSTRUCTED: u8 = 0x20;
const OCTET_STRING: u8 = 0x04;

/// `input`, one element and nothing after it, in DER form; `None` if it is
/// not BER this understands.
pub(super) fn to_der(input: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len());
    let rest = element(input, &mut out, 0)?;
    rest.is_empty().then_some(out)
}

/// Converts the element at the start of `b` into `out`; the bytes after it.
fn element<'a>(b: &'a [u8], out: &mut Vec<u8>, depth: usize) -> Option<&'a [u8]> {
    if depth > MAX_DEPTH {
        return None;
    }
    let (&tag, b) = b.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (len, b) = length(b)?;
    if tag & CONSTRUCTED == 0 {
        let len = len?;
        let (value, rest) = (b.get(..len)?, b.get(len..)?);
        put(out, tag, value);
        return Some(rest);
    }
    let mut inner = Vec::new();
    let rest = match len {
        Some(len) => {
            let (mut value, rest) = (b.get(..len)?, b.get(len..)?);
            while !value.is_empty() {
                value = element(value, &mut inner, depth + 1)?;
            }
            rest
        }
        None => {
            let mut value = b;
            loop {
                if let Some(rest) = value.strip_prefix(&[0, 0]) {
                    break rest;
                }
                value = element(value, &mut inner, depth + 1)?;
            }
        }
    };
    if tag == OCTET_STRING | CONSTRUCTED {
        put(out, OCTET_STRING, &chunks(&inner)?);
    } else {
        put(out, tag, &inner);
    }
    Some(rest)
}

/// The values of a run of (already DER) primitive OCTET STRINGs, joined.
fn chunks(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut joined = Vec::with_capacity(b.len());
    while let Some((&tag, rest)) = b.split_first() {
        if tag != OCTET_STRING {
            return None;
        }
        let (len, rest) = length(rest)?;
        let len = len?;
        joined.extend_from_slice(rest.get(..len)?);
        b = rest.get(len..)?;
    }
    Some(joined)
}

/// A length (`None`: indefinite) and the bytes after it.
fn length(b: &[u8]) -> Option<(Option<usize>, &[u8])> {
    let (&first, b) = b.split_first()?;
    match first {
        0..=0x7f => Some((Some(usize::from(first)), b)),
        0x80 => Some((None, b)),
        0x81..=0x84 => {
            let n = usize::from(first & 0x7f);
            let len = b
                .get(..n)?
                .iter()
                .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
            Some((Some(len), b.get(n..)?))
        }
        _ => None,
    }
}

/// Appends `tag`, the DER length of `value`, and `value`.
fn put(out: &mut Vec<u8>, tag: u8, value: &[u8]) {
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&x| x == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indefinite_and_chunked_become_der() {
        // SEQUENCE (indefinite) { OCTET STRING chunks "ab" "c" (indefinite), NULL }
        let ber = [
            0x30, 0x80, 0x24, 0x80, 0x04, 0x02, b'a', b'b', 0x04, 0x01, b'c', 0x00, 0x00, 0x05,
            0x00, 0x00, 0x00,
        ];
        assert_eq!(
            to_der(&ber),
            Some(vec![0x30, 0x07, 0x04, 0x03, b'a', b'b', b'c', 0x05, 0x00])
        );
        let der = [0x30, 0x03, 0x02, 0x01, 0x05];
        assert_eq!(to_der(&der).as_deref(), Some(&der[..]));
    }

    #[test]
    fn malformed_is_refused() {
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x80],
            &[0x30, 0x80, 0x00],
            &[0x04, 0x80, 0x00, 0x00],
            &[0x30, 0x02, 0x05],
            &[0x30, 0x85, 0, 0, 0, 0, 0],
            &[0x1f, 0x01, 0x00],
            &[0x24, 0x03, 0x02, 0x01, 0x00],
            &[0x05, 0x00, 0x00],
        ] {
            assert_eq!(to_der(bad), None, "{bad:x?}");
        }
        let deep: Vec<u8> = std::iter::repeat_n([0x30, 0x80], 40).flatten().collect();
        assert_eq!(to_der(&deep), None);
    }
}
