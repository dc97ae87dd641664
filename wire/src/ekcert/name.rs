//! Whether an issuer name is a CA's subject name, compared as RFC 5280
//! §7.1 asks rather than byte for byte: makers re-encode names between a CA
//! certificate and the certificates it issues (a PrintableString subject,
//! a UTF8String issuer; a doubled space; another case), and a verifier that
//! compares bytes finds no issuer.
//!
//! Two names are the same when they have the same RDNs in the same order,
//! each RDN the same set of attributes (in any order: a multi-valued RDN
//! such as Nuvoton's `CN + O + C` is a SET, and makers do not sort it as
//! DER would), each attribute the same type with the same value: for the
//! string types, after decoding, trimming, collapsing runs of white space
//! to one space and folding case; for any other type, the same bytes. This
//! is the part of RFC 4518 string preparation that real EK certificates
//! need (no Unicode normalisation). Names only pick candidate issuers: the
//! issuer's signature is what links a certificate to it.

use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::x509::{AttributeTypeAndValue, RelativeDistinguishedName, X509Name};

/// Most attributes in one RDN compared as a set; a larger RDN (no real
/// name has one) must match byte for byte.
const MAX_RDN_ATTRIBUTES: usize = 8;

/// Whether `a` and `b` name the same entity.
pub(crate) fn same_name(a: &X509Name<'_>, b: &X509Name<'_>) -> bool {
    if a.as_raw() == b.as_raw() {
        return true;
    }
    let (ra, rb) = (a.iter().count(), b.iter().count());
    ra == rb && a.iter().zip(b.iter()).all(|(x, y)| same_rdn(x, y))
}

fn same_rdn(a: &RelativeDistinguishedName<'_>, b: &RelativeDistinguishedName<'_>) -> bool {
    let xa: Vec<_> = a.iter().collect();
    let xb: Vec<_> = b.iter().collect();
    if xa.len() != xb.len() || xa.len() > MAX_RDN_ATTRIBUTES {
        return false;
    }
    // A set: every attribute of `a` matched by a distinct one of `b`.
    let mut taken = [false; MAX_RDN_ATTRIBUTES];
    xa.iter().all(|x| {
        let found = xb
            .iter()
            .enumerate()
            .find(|(i, y)| !taken[*i] && same_attribute(x, y));
        match found {
            Some((i, _)) => {
                taken[i] = true;
                true
            }
            None => false,
        }
    })
}

fn same_attribute(a: &AttributeTypeAndValue<'_>, b: &AttributeTypeAndValue<'_>) -> bool {
    if a.attr_type() != b.attr_type() {
        return false;
    }
    match (prepared(a), prepared(b)) {
        (Some(x), Some(y)) => x == y,
        _ => {
            a.attr_value().tag() == b.attr_value().tag()
                && a.attr_value().data == b.attr_value().data
        }
    }
}

/// A string attribute's value, trimmed, its white space runs collapsed and
/// its case folded; None for a value that is not a string or does not
/// decode.
fn prepared(attr: &AttributeTypeAndValue<'_>) -> Option<String> {
    let value = attr.attr_value();
    let data = value.data;
    let text: String = match value.tag() {
        Tag::Utf8String
        | Tag::PrintableString
        | Tag::Ia5String
        | Tag::NumericString
        | Tag::VisibleString => std::str::from_utf8(data).ok()?.to_owned(),
        // T.61 as Latin-1: what every real TeletexString name holds.
        Tag::TeletexString => data.iter().map(|&b| char::from(b)).collect(),
        Tag::BmpString => {
            if data.len() % 2 != 0 {
                return None;
            }
            let units = data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .ok()?
        }
        Tag::UniversalString => {
            if data.len() % 4 != 0 {
                return None;
            }
            data.chunks_exact(4)
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect::<Option<String>>()?
        }
        _ => return None,
    };
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(collapsed.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, DnValue, KeyPair};
    use x509_parser::prelude::{FromDer, X509Certificate};

    fn subject(dn: Vec<(DnType, DnValue)>) -> Vec<u8> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t, v);
        }
        p.self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .der()
            .to_vec()
    }

    fn same(a: &[u8], b: &[u8]) -> bool {
        let (_, a) = X509Certificate::from_der(a).unwrap();
        let (_, b) = X509Certificate::from_der(b).unwrap();
        same_name(a.subject(), b.subject())
    }

    fn printable(s: &str) -> DnValue {
        DnValue::PrintableString(s.try_into().unwrap())
    }

    #[test]
    fn names_equal_after_preparation() {
        let base = subject(vec![
            (DnType::CountryName, printable("CH")),
            (
                DnType::CommonName,
                DnValue::Utf8String("STM TPM EK Root CA".into()),
            ),
        ]);
        // PrintableString for UTF8String, a doubled and a trailing space,
        // another case.
        let other = subject(vec![
            (DnType::CountryName, printable("ch")),
            (DnType::CommonName, printable("STM  TPM EK root CA ")),
        ]);
        assert!(same(&base, &other));
        // BMPString.
        let bmp = subject(vec![
            (DnType::CountryName, printable("CH")),
            (
                DnType::CommonName,
                DnValue::BmpString("STM TPM EK Root CA".try_into().unwrap()),
            ),
        ]);
        assert!(same(&base, &bmp));
        // Another value, another order, a missing RDN: other names.
        let ca05 = subject(vec![
            (DnType::CountryName, printable("CH")),
            (DnType::CommonName, printable("STM TPM EK Root CA 05")),
        ]);
        assert!(!same(&base, &ca05));
        let swapped = subject(vec![
            (
                DnType::CommonName,
                DnValue::Utf8String("STM TPM EK Root CA".into()),
            ),
            (DnType::CountryName, printable("CH")),
        ]);
        assert!(!same(&base, &swapped));
        let short = subject(vec![(
            DnType::CommonName,
            DnValue::Utf8String("STM TPM EK Root CA".into()),
        )]);
        assert!(!same(&base, &short));
    }

    /// Nuvoton's names are one RDN `CN + O + C` in an order DER would not
    /// sort it in (Python's cryptography refuses to parse them): the same
    /// set in DER order is the same name.
    #[test]
    fn a_multi_valued_rdn_is_a_set() {
        let der = crate::ekcert::real::der("nuvoton-tpm-root-ca-2111-cd8185ff.pem");
        let (_, nuvoton) = X509Certificate::from_der(&der).unwrap();
        let rdns: Vec<_> = nuvoton.subject().iter().collect();
        assert_eq!(rdns.len(), 1);
        assert_eq!(rdns[0].iter().count(), 3);
        // The same three attributes, sorted by their encoding: another SET
        // encoding of the same RDN.
        let mut attrs: Vec<&[u8]> = Vec::new();
        let raw = nuvoton.subject().as_raw();
        // SEQUENCE { SET { ATV, ATV, ATV } }: walk the SET's members.
        let set = &raw[tlv_header(raw)..];
        let mut body = &set[tlv_header(set)..];
        while !body.is_empty() {
            let n = tlv_len(body);
            attrs.push(&body[..n]);
            body = &body[n..];
        }
        assert_eq!(attrs.len(), 3);
        attrs.reverse();
        let set_body: Vec<u8> = attrs.concat();
        let reordered = tlv(0x30, &tlv(0x31, &set_body));
        assert_ne!(reordered.as_slice(), raw);
        let (_, name) = X509Name::from_der(&reordered).unwrap();
        assert!(same_name(nuvoton.subject(), &name));
        assert!(same_name(&name, nuvoton.subject()));
    }

    fn tlv_header(b: &[u8]) -> usize {
        match b[1] {
            n if n < 0x80 => 2,
            n => 2 + usize::from(n & 0x7f),
        }
    }

    fn tlv_len(b: &[u8]) -> usize {
        let h = tlv_header(b);
        let len = match b[1] {
            n if n < 0x80 => usize::from(n),
            _ => b[2..h].iter().fold(0, |a, &x| (a << 8) | usize::from(x)),
        };
        h + len
    }

    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match body.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
            n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(body);
        out
    }
}
