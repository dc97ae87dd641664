//! A certification path from an EK certificate to a configured anchor.
//!
//! Makers issue EK certificates from intermediates (many per maker, per
//! platform, per security version) and operators configure the maker's
//! root. Every certificate the operator configured as an anchor is one,
//! self-signed or not (as in Go's x509 root pools and OpenSSL's partial
//! chains): STM's "STM TPM EK Root CA" is cross-signed by GlobalSign, and
//! it is what STM publishes. The intermediates come from wherever they can
//! be found and none is trusted: each link is verified (the issuer's
//! signature over the certificate's original TBS bytes, never a
//! re-encoding; CA basicConstraints, keyCertSign, pathLenConstraint,
//! validity at the given time). The walk stops at the first anchor that
//! verifies, so an expired or cross-signed root above it never refuses a
//! valid path.
//!
//! Which certificates may have issued one ([`candidates`]): those whose
//! subject key identifier is its authority key identifier, and those whose
//! subject is its issuer name, compared as RFC 5280 asks ([`super::name`]:
//! real makers re-encode names between a CA and what it issues). Several
//! can match (a CA re-issued under the same name, with the same key or
//! another; a cross-certificate): each is tried, anchors first, the key
//! identifier matches first, backtracking when a path above fails.
//!
//! The work is bounded for input an unauthenticated agent chooses: at most
//! [`MAX_DEPTH`] issuers above the EK certificate and at most
//! [`MAX_SIGNATURE_CHECKS`] signature verifications per path.

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;

/// Most CA certificates above the EK certificate, the anchor included.
pub const MAX_DEPTH: usize = 4;
/// Most signature verifications one path search may make.
pub(crate) const MAX_SIGNATURE_CHECKS: usize = 32;

/// Why no path was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// No certificate anywhere is named as the issuer of the last
    /// certificate reached: `missing` is that issuer's DN.
    #[error("the issuer {missing} is missing: it is neither a configured anchor nor among the intermediates")]
    MissingIssuer { missing: String },
    /// Candidates were found, and each failed a check.
    #[error("{0}")]
    Invalid(String),
}

/// A path that was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchored {
    /// The anchor's subject DN.
    pub anchor: String,
    /// Intermediates between the EK certificate and the anchor.
    pub intermediates: usize,
}

/// Whether `cert` is self-signed: its own issuer, verified by its own key.
pub fn is_self_signed(cert: &X509Certificate<'_>) -> bool {
    cert.subject().as_raw() == cert.issuer().as_raw() && super::signed_by(cert, cert.public_key())
}

/// Builds a path from `leaf` to one of `anchors` through any of
/// `intermediates` (each used at most once), every issuer valid at `now_s`
/// (seconds since the epoch). The leaf's own validity is the caller's.
pub fn build_path(
    leaf: &X509Certificate<'_>,
    anchors: &[X509Certificate<'_>],
    intermediates: &[X509Certificate<'_>],
    now_s: i64,
) -> Result<Anchored, ChainError> {
    let mut search = Search {
        anchors,
        intermediates,
        now_s,
        checks: 0,
        problems: Vec::new(),
        missing: None,
    };
    let mut used = Vec::new();
    if let Some(found) = search.walk(leaf, 0, &mut used) {
        return Ok(found);
    }
    match (search.problems.is_empty(), search.missing) {
        (true, Some((_, missing))) => Err(ChainError::MissingIssuer { missing }),
        (true, None) => Err(ChainError::Invalid("no path".into())),
        (false, missing) => {
            let mut text = search.problems.join("; ");
            if let Some((_, m)) = missing {
                text.push_str(&format!("; the issuer {m} is missing"));
            }
            Err(ChainError::Invalid(text))
        }
    }
}

struct Search<'s, 'a> {
    anchors: &'s [X509Certificate<'a>],
    intermediates: &'s [X509Certificate<'a>],
    now_s: i64,
    checks: usize,
    /// Why candidates were refused, in the order met.
    problems: Vec<String>,
    /// The deepest issuer no certificate is named as: (depth, DN).
    missing: Option<(usize, String)>,
}

impl<'a> Search<'_, 'a> {
    /// `depth`: CA certificates between `child`'s issuer and the leaf.
    fn walk(
        &mut self,
        child: &X509Certificate<'a>,
        depth: usize,
        used: &mut Vec<usize>,
    ) -> Option<Anchored> {
        if depth >= MAX_DEPTH {
            self.problem(format!("the path is longer than {MAX_DEPTH} issuers"));
            return None;
        }
        let mut named = false;
        let anchors = self.anchors;
        for i in candidates(anchors, child) {
            named = true;
            let anchor = &anchors[i];
            if self.verified(child, anchor) && self.usable_issuer(anchor, depth) {
                return Some(Anchored {
                    anchor: anchor.subject().to_string(),
                    intermediates: depth,
                });
            }
        }
        let intermediates = self.intermediates;
        for i in candidates(intermediates, child) {
            if used.contains(&i) {
                continue;
            }
            named = true;
            let ca = &intermediates[i];
            if !self.verified(child, ca) || !self.usable_issuer(ca, depth) {
                continue;
            }
            used.push(i);
            if let Some(found) = self.walk(ca, depth + 1, used) {
                return Some(found);
            }
            used.pop();
        }
        if !named && self.missing.as_ref().is_none_or(|(d, _)| depth > *d) {
            self.missing = Some((depth, child.issuer().to_string()));
        }
        None
    }

    /// Whether `issuer`'s key verifies `child`'s signature, within budget.
    fn verified(&mut self, child: &X509Certificate<'_>, issuer: &X509Certificate<'_>) -> bool {
        if self.checks >= MAX_SIGNATURE_CHECKS {
            self.problem(format!(
                "more than {MAX_SIGNATURE_CHECKS} candidate issuers to verify"
            ));
            return false;
        }
        self.checks += 1;
        if super::signed_by(child, issuer.public_key()) {
            true
        } else {
            self.problem(format!(
                "{}'s key does not verify the signature of {}",
                issuer.subject(),
                child.subject()
            ));
            false
        }
    }

    fn usable_issuer(&mut self, ca: &X509Certificate<'_>, cas_below: usize) -> bool {
        match check_issuer(ca, cas_below, self.now_s) {
            Ok(()) => true,
            Err(m) => {
                self.problem(m);
                false
            }
        }
    }

    fn problem(&mut self, m: String) {
        // Bounded: the same few messages repeat on a hostile input.
        if self.problems.len() < 8 && !self.problems.contains(&m) {
            self.problems.push(m);
        }
    }
}

/// The indices of the certificates in `pool` that may have issued `child`,
/// best first: its authority key identifier is their subject key
/// identifier (whatever their name); else their subject is its issuer
/// name and no key identifier says otherwise; else the name matches but
/// the key identifiers differ (a CA re-issued with identifiers computed
/// another way). Only the signature decides.
fn candidates(pool: &[X509Certificate<'_>], child: &X509Certificate<'_>) -> Vec<usize> {
    let aki = authority_key_id(child);
    let mut ranked: Vec<(u8, usize)> = pool
        .iter()
        .enumerate()
        .filter_map(|(i, ca)| {
            let ids = aki.zip(subject_key_id(ca)).map(|(a, s)| a == s);
            let named = || super::name::same_name(ca.subject(), child.issuer());
            match ids {
                Some(true) => Some((0, i)),
                None if named() => Some((1, i)),
                Some(false) if named() => Some((2, i)),
                _ => None,
            }
        })
        .collect();
    ranked.sort_unstable();
    ranked.into_iter().map(|(_, i)| i).collect()
}

/// The keyIdentifier of `cert`'s authorityKeyIdentifier (None if absent or empty).
fn authority_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => aki
                .key_identifier
                .as_ref()
                .map(|k| k.0)
                .filter(|k| !k.is_empty()),
            _ => None,
        })
}

/// `cert`'s subjectKeyIdentifier (None if absent or empty).
fn subject_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0).filter(|k| !k.is_empty()),
            _ => None,
        })
}

/// Whether `cert` is valid at `now_s`.
pub(crate) fn valid_at(cert: &X509Certificate<'_>, now_s: i64) -> bool {
    let v = cert.validity();
    v.not_before.timestamp() <= now_s && now_s <= v.not_after.timestamp()
}

/// A CA by basicConstraints, keyCertSign when it has a keyUsage, within
/// its pathLenConstraint, valid at `now_s`.
fn check_issuer(ca: &X509Certificate<'_>, cas_below: usize, now_s: i64) -> Result<(), String> {
    let name = ca.subject().to_string();
    let bc = ca
        .basic_constraints()
        .map_err(|_| format!("issuer {name}: malformed basicConstraints"))?;
    let Some(bc) = bc.filter(|bc| bc.value.ca) else {
        return Err(format!("issuer {name} is not a CA"));
    };
    if let Some(max) = bc.value.path_len_constraint {
        if usize::try_from(max).is_ok_and(|max| cas_below > max) {
            return Err(format!("issuer {name}: path length exceeded"));
        }
    }
    match ca.key_usage() {
        Ok(None) => {}
        Ok(Some(ku)) if ku.value.key_cert_sign() => {}
        _ => return Err(format!("issuer {name} may not sign certificates")),
    }
    if !valid_at(ca, now_s) {
        return Err(format!("issuer {name} is not valid at this time"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    use x509_parser::prelude::FromDer;

    /// 2030-01-01, inside every test certificate's validity but the expired ones'.
    pub(crate) const NOW: i64 = 1_893_456_000;

    pub(crate) struct Ca {
        pub der: Vec<u8>,
        pub issuer: Issuer<'static, KeyPair>,
    }

    pub(crate) fn ca_params(name: &str, years: (i32, i32)) -> CertificateParams {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        p.not_before = rcgen::date_time_ymd(years.0, 1, 1);
        p.not_after = rcgen::date_time_ymd(years.1, 1, 1);
        p
    }

    pub(crate) fn root(name: &str, years: (i32, i32)) -> Ca {
        let key = KeyPair::generate().unwrap();
        let p = ca_params(name, years);
        let der = p.self_signed(&key).unwrap().der().to_vec();
        Ca {
            der,
            issuer: Issuer::new(p, key),
        }
    }

    /// A CA named `name` with a new key, signed by `by`.
    pub(crate) fn sub(name: &str, by: &Ca, p: Option<CertificateParams>) -> Ca {
        let key = KeyPair::generate().unwrap();
        let p = p.unwrap_or_else(|| ca_params(name, (2020, 2040)));
        let der = p.signed_by(&key, &by.issuer).unwrap().der().to_vec();
        Ca {
            der,
            issuer: Issuer::new(p, key),
        }
    }

    /// `ca`'s own name and key, signed by `by`: a cross-certificate.
    fn cross(ca: &Ca, by: &Ca, years: (i32, i32)) -> Vec<u8> {
        let mut p = ca_params("", years);
        p.distinguished_name = ca.issuer_params_dn();
        p.signed_by(ca.issuer.key(), &by.issuer)
            .unwrap()
            .der()
            .to_vec()
    }

    impl Ca {
        fn issuer_params_dn(&self) -> rcgen::DistinguishedName {
            let (_, c) = X509Certificate::from_der(&self.der).unwrap();
            let cn = c
                .subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned();
            let mut dn = rcgen::DistinguishedName::new();
            dn.push(DnType::CommonName, cn);
            dn
        }
    }

    pub(crate) fn leaf(by: &Ca) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2040, 1, 1);
        p.signed_by(&key, &by.issuer).unwrap().der().to_vec()
    }

    fn parse(ders: &[&[u8]]) -> Vec<X509Certificate<'static>> {
        ders.iter()
            .map(|d| {
                let owned: &'static [u8] = Box::leak(d.to_vec().into_boxed_slice());
                X509Certificate::from_der(owned).unwrap().1
            })
            .collect()
    }

    fn path(leaf: &[u8], anchors: &[&[u8]], ints: &[&[u8]]) -> Result<Anchored, ChainError> {
        let leaf = parse(&[leaf]).remove(0);
        build_path(&leaf, &parse(anchors), &parse(ints), NOW)
    }

    #[test]
    fn through_an_untrusted_intermediate_to_the_root() {
        let r = root("Maker Root", (2020, 2040));
        let i = sub("Maker EK CA 7", &r, None);
        let ek = leaf(&i);
        let found = path(&ek, &[&r.der], &[&i.der]).unwrap();
        assert_eq!(found.anchor, "CN=Maker Root");
        assert_eq!(found.intermediates, 1);
        // Nowhere: the missing issuer is named.
        assert_eq!(
            path(&ek, &[&r.der], &[]).unwrap_err(),
            ChainError::MissingIssuer {
                missing: "CN=Maker EK CA 7".into()
            }
        );
        // The intermediate alone is no anchor for another root.
        let other = root("Other Root", (2020, 2040));
        assert_eq!(
            path(&ek, &[&other.der], &[&i.der]).unwrap_err(),
            ChainError::MissingIssuer {
                missing: "CN=Maker Root".into()
            }
        );
        assert!(is_self_signed(&parse(&[&r.der])[0]));
        assert!(!is_self_signed(&parse(&[&i.der])[0]));
    }

    #[test]
    fn stops_at_the_first_anchor_above_an_expired_or_cross_signed_root() {
        // The configured root R, cross-signed by an old root O that has
        // expired; the agent sends the cross-certificate too.
        let old = root("Old Maker Root", (2000, 2025));
        let r = root("Maker Root", (2020, 2040));
        let r_by_old = cross(&r, &old, (2020, 2025));
        let i = sub("Maker EK CA 7", &r, None);
        let ek = leaf(&i);
        for ints in [
            vec![r_by_old.as_slice(), i.der.as_slice()],
            vec![i.der.as_slice(), r_by_old.as_slice()],
        ] {
            let found = path(&ek, &[&r.der], &ints).unwrap();
            assert_eq!(found.anchor, "CN=Maker Root");
        }
        // Both roots configured, the expired one first: still R.
        let found = path(&ek, &[&old.der, &r.der], &[&r_by_old, &i.der]).unwrap();
        assert_eq!(found.anchor, "CN=Maker Root");
        // Only the expired old root configured: the cross path is refused.
        let e = path(&ek, &[&old.der], &[&r_by_old, &i.der]).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("not valid at this time")),
            "{e}"
        );
        // A re-keyed root under the same name, expired, configured beside
        // the current one: the walk backtracks to the one that verifies.
        let stale = root("Maker Root", (2000, 2025));
        let found = path(&ek, &[&stale.der, &r.der], &[&i.der]).unwrap();
        assert_eq!(found.anchor, "CN=Maker Root");
    }

    #[test]
    fn refuses_bad_links() {
        let r = root("Maker Root", (2020, 2040));
        // A same-named impostor intermediate: its key does not verify.
        let i = sub("Maker EK CA 7", &r, None);
        let impostor = sub("Maker EK CA 7", &r, None);
        let ek = leaf(&i);
        let e = path(&ek, &[&r.der], &[&impostor.der]).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("does not verify")),
            "{e}"
        );
        // Beside the real one, the real one is found.
        path(&ek, &[&r.der], &[&impostor.der, &i.der]).unwrap();
        // Not a CA.
        let mut p = ca_params("Leafy", (2020, 2040));
        p.is_ca = IsCa::ExplicitNoCa;
        let leafy = sub("Leafy", &r, Some(p));
        let e = path(&leaf(&leafy), &[&r.der], &[&leafy.der]).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("is not a CA")),
            "{e}"
        );
        // pathlen:0 above another CA.
        let mut p = ca_params("Constrained", (2020, 2040));
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let c = sub("Constrained", &r, Some(p));
        let below = sub("Below", &c, None);
        let e = path(&leaf(&below), &[&r.der], &[&c.der, &below.der]).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("path length")),
            "{e}"
        );
        // Expired intermediate.
        let old = sub("Old CA", &r, Some(ca_params("Old CA", (2000, 2025))));
        let e = path(&leaf(&old), &[&r.der], &[&old.der]).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("not valid")),
            "{e}"
        );
    }

    #[test]
    fn the_work_is_bounded() {
        // Five CAs deep: longer than MAX_DEPTH.
        let r = root("R", (2020, 2040));
        let mut chain = vec![sub("C0", &r, None)];
        for n in 1..5 {
            let next = sub(&format!("C{n}"), chain.last().unwrap(), None);
            chain.push(next);
        }
        let ek = leaf(chain.last().unwrap());
        let ints: Vec<&[u8]> = chain.iter().map(|c| c.der.as_slice()).collect();
        let e = path(&ek, &[&r.der], &ints).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("longer than")),
            "{e}"
        );
        path(&ek, &[&r.der], &ints[..0]).unwrap_err();
        // Three deep is fine.
        let ek3 = leaf(&chain[2]);
        assert_eq!(path(&ek3, &[&r.der], &ints).unwrap().intermediates, 3);
        // Many same-named candidates that do not verify: bounded checks.
        let i = sub("Maker EK CA", &r, None);
        let ek = leaf(&i);
        let fakes: Vec<Ca> = (0..40).map(|_| sub("Maker EK CA", &r, None)).collect();
        let ints: Vec<&[u8]> = fakes.iter().map(|c| c.der.as_slice()).collect();
        let e = path(&ek, &[&r.der], &ints).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("candidate issuers")),
            "{e}"
        );
    }

    /// Seconds since the epoch at midnight UTC of a date.
    fn at(y: i32, m: u8, d: u8) -> i64 {
        rcgen::date_time_ymd(y, m, d).unix_timestamp()
    }

    fn real(names: &[&str]) -> Vec<X509Certificate<'static>> {
        let ders: Vec<Vec<u8>> = names.iter().map(|n| crate::ekcert::real::der(n)).collect();
        let refs: Vec<&[u8]> = ders.iter().map(Vec::as_slice).collect();
        parse(&refs)
    }

    fn real_path(
        leaf: &str,
        anchors: &[&str],
        ints: &[&str],
        now: i64,
    ) -> Result<Anchored, ChainError> {
        build_path(&real(&[leaf])[0], &real(anchors), &real(ints), now)
    }

    const IFX_RSA_CA_2017: &str = "ifx-optiga-rsa-manufacturing-ca-035-6b8b6216.pem";
    const IFX_RSA_CA_2023: &str = "ifx-optiga-rsa-manufacturing-ca-035-9efd7b3c.pem";
    const STM_RSA_ROOT: &str = "stm-tpm-ek-root-ca-f8e37a86.pem";
    const STM_RSA_CA: &str = "stm-tpm-ek-intermediate-ca-05-870fc181.pem";
    const STM_ECC_ROOT: &str = "stm-tpm-ecc-root-ca-01-c541d7e5.pem";
    const STM_ECC_CA: &str = "stm-tpm-ecc-intermediate-ca-01-015bcfc3.pem";
    const GS_RSA: &str = "globalsign-trusted-platform-module-root-ca-f27bf02c.pem";
    const GS_ECC: &str = "globalsign-trusted-platform-module-ecc-root-ca-5a8c7b5e.pem";

    /// Every real leaf chains to its maker's root as the maker publishes
    /// it, through the maker's real intermediates: STM's roots are
    /// cross-signed by GlobalSign and are anchors all the same; STM's
    /// intermediates carry a critical certificatePolicies; Nuvoton's leaf
    /// hangs off its root, an ECDSA key signing an RSA EK certificate.
    #[test]
    fn real_leaves_chain_to_their_makers_roots() {
        let now = at(2024, 6, 1);
        for (leaf, anchor, ints, depth) in [
            (
                "ifx-optiga-ecc-ek-mfgca035.pem",
                "ifx-optiga-ecc-root-ca-cfeb02fe.pem",
                &["ifx-optiga-ecc-manufacturing-ca-035-1f61aed7.pem"][..],
                1,
            ),
            (
                "ifx-optiga-rsa-ek-mfgca035.pem",
                "ifx-optiga-rsa-root-ca-899e3547.pem",
                &[IFX_RSA_CA_2017][..],
                1,
            ),
            (
                "nuvoton-npct75x-rsa-ek-rootca2111-b.pem",
                "nuvoton-tpm-root-ca-2111-cd8185ff.pem",
                &[][..],
                0,
            ),
            (
                "stm-st33htph-ecc-ek-eccintca01.pem",
                STM_ECC_ROOT,
                &[STM_ECC_CA][..],
                1,
            ),
            (
                "stm-st33htph-rsa-ek-intca05.pem",
                STM_RSA_ROOT,
                &[STM_RSA_CA][..],
                1,
            ),
        ] {
            let found =
                real_path(leaf, &[anchor], ints, now).unwrap_or_else(|e| panic!("{leaf}: {e}"));
            assert_eq!(found.intermediates, depth, "{leaf}");
            assert!(!is_self_signed(&real(&[STM_RSA_ROOT])[0]));
        }
        // What keylime's tpm_cert_store holds: STM's root and intermediate
        // beside GlobalSign's root. Anchored at STM's root, the first.
        let found = real_path(
            "stm-st33htph-rsa-ek-intca05.pem",
            &[GS_RSA, STM_RSA_ROOT],
            &[STM_RSA_CA],
            now,
        )
        .unwrap();
        assert_eq!(found.intermediates, 1);
        // Only GlobalSign's root trusted: STM's root is an intermediate.
        let found = real_path(
            "stm-st33htph-ecc-ek-eccintca01.pem",
            &[GS_ECC],
            &[STM_ECC_CA, STM_ECC_ROOT],
            now,
        )
        .unwrap();
        assert!(found.anchor.contains("GlobalSign"), "{}", found.anchor);
        assert_eq!(found.intermediates, 2);
        // STM's intermediates do carry a critical certificatePolicies.
        for ca in real(&[STM_RSA_CA, STM_ECC_CA]) {
            let policies = ca
                .extensions()
                .iter()
                .find(|e| e.oid.to_id_string() == "2.5.29.32")
                .unwrap();
            assert!(policies.critical);
        }
        // Another maker's root is no anchor for them.
        let e = real_path(
            "stm-st33htph-rsa-ek-intca05.pem",
            &["ifx-optiga-rsa-root-ca-899e3547.pem"],
            &[STM_RSA_CA],
            now,
        )
        .unwrap_err();
        assert!(
            matches!(e, ChainError::MissingIssuer { ref missing } if missing.contains("STM TPM EK Root CA")),
            "{e}"
        );
    }

    /// Infineon re-issued "RSA Manufacturing CA 035" in 2023 with the
    /// name and key of the 2017 one: whichever comes first, the one valid
    /// at the time is found.
    #[test]
    fn a_ca_re_issued_under_the_same_name_and_key() {
        let leaf = "ifx-optiga-rsa-ek-mfgca035.pem";
        let root = "ifx-optiga-rsa-root-ca-899e3547.pem";
        for ints in [
            [IFX_RSA_CA_2023, IFX_RSA_CA_2017],
            [IFX_RSA_CA_2017, IFX_RSA_CA_2023],
        ] {
            // 2020: only the 2017 certificate is valid.
            real_path(leaf, &[root], &ints, at(2020, 1, 1)).unwrap();
            // 2040: only the 2023 one.
            real_path(leaf, &[root], &ints, at(2040, 1, 1)).unwrap();
            // 2044: neither (nor the root).
            real_path(leaf, &[root], &ints, at(2044, 1, 1)).unwrap_err();
        }
        let e = real_path(leaf, &[root], &[IFX_RSA_CA_2023], at(2020, 1, 1)).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("not valid at this time")),
            "{e}"
        );
    }

    /// The Nuvoton certificates' names are a SET not in DER order: the
    /// signature verifies over the TBS bytes as they are, and no longer
    /// over the same TBS with the SET re-encoded in DER order.
    #[test]
    fn signatures_are_over_the_original_tbs_bytes() {
        let leaf_der = crate::ekcert::real::der("nuvoton-npct75x-rsa-ek-rootca2111-b.pem");
        let root = real(&["nuvoton-tpm-root-ca-2111-cd8185ff.pem"]);
        let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
        assert!(crate::ekcert::signed_by(&leaf, root[0].public_key()));
        // The issuer name's SET members, sorted as DER sorts a SET OF.
        let issuer = leaf.issuer().as_raw();
        let at_ = leaf_der
            .windows(issuer.len())
            .position(|w| w == issuer)
            .unwrap();
        let mut members = Vec::new();
        let set = &issuer[2..];
        let mut body = &set[2..];
        while !body.is_empty() {
            let n = 2 + usize::from(body[1]);
            members.push(&body[..n]);
            body = &body[n..];
        }
        let mut sorted = members.clone();
        sorted.sort();
        assert_ne!(sorted, members, "the real name is not in DER order");
        let mut canonical = leaf_der.clone();
        canonical[at_ + 4..at_ + issuer.len()].copy_from_slice(&sorted.concat());
        let (_, reencoded) = X509Certificate::from_der(&canonical).unwrap();
        assert!(super::super::name::same_name(
            reencoded.issuer(),
            leaf.issuer()
        ));
        assert!(!crate::ekcert::signed_by(&reencoded, root[0].public_key()));
    }

    fn printable(s: &str) -> rcgen::DnValue {
        rcgen::DnValue::PrintableString(s.try_into().unwrap())
    }

    /// A CA named `dn`, with key identifiers or without any, self-signed.
    fn ca_named(dn: rcgen::DistinguishedName, key_ids: bool) -> (Vec<u8>, KeyPair) {
        ca_named_by(dn, key_ids, None)
    }

    /// Like [`ca_named`], signed by `by` when given.
    fn ca_named_by(
        dn: rcgen::DistinguishedName,
        key_ids: bool,
        by: Option<&Ca>,
    ) -> (Vec<u8>, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut p = ca_params("", (2020, 2040));
        p.distinguished_name = dn;
        if !key_ids {
            // rcgen writes a subjectKeyIdentifier with its basicConstraints:
            // write the extension itself (cA TRUE, critical).
            p.is_ca = IsCa::NoCa;
            let mut bc = rcgen::CustomExtension::from_oid_content(
                &[2, 5, 29, 19],
                vec![0x30, 0x03, 0x01, 0x01, 0xff],
            );
            bc.set_criticality(true);
            p.custom_extensions = vec![bc];
        }
        let der = match by {
            Some(by) => p.signed_by(&key, &by.issuer).unwrap(),
            None => p.self_signed(&key).unwrap(),
        };
        (der.der().to_vec(), key)
    }

    /// A leaf signed by `key`, naming `issuer_dn` as its issuer, with an
    /// authorityKeyIdentifier (that of `key`) or not.
    fn leaf_from(issuer_dn: rcgen::DistinguishedName, key: KeyPair, aki: bool) -> Vec<u8> {
        let mut ip = CertificateParams::new(Vec::<String>::new()).unwrap();
        ip.distinguished_name = issuer_dn;
        let issuer = Issuer::new(ip, key);
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2040, 1, 1);
        p.use_authority_key_identifier_extension = aki;
        p.signed_by(&KeyPair::generate().unwrap(), &issuer)
            .unwrap()
            .der()
            .to_vec()
    }

    fn dn(parts: &[(DnType, rcgen::DnValue)]) -> rcgen::DistinguishedName {
        let mut dn = rcgen::DistinguishedName::new();
        for (t, v) in parts {
            dn.push(t.clone(), v.clone());
        }
        dn
    }

    /// The issuer name is the CA's subject only after normalisation (a
    /// doubled space, PrintableString for UTF8String, another case): found
    /// by its key identifier, and by its name when there are none.
    #[test]
    fn issuer_names_equal_after_normalisation() {
        let subject = dn(&[
            (DnType::CountryName, printable("TW")),
            (
                DnType::CommonName,
                rcgen::DnValue::Utf8String("Maker EK CA".into()),
            ),
        ]);
        let written = dn(&[
            (DnType::CountryName, printable("TW")),
            (DnType::CommonName, printable("maker  EK CA")),
        ]);
        for key_ids in [true, false] {
            let (ca, key) = ca_named(subject.clone(), key_ids);
            let ek = leaf_from(written.clone(), key, key_ids);
            let (_, c) = X509Certificate::from_der(&ek).unwrap();
            let (_, a) = X509Certificate::from_der(&ca).unwrap();
            assert_ne!(c.issuer().as_raw(), a.subject().as_raw());
            assert_eq!(authority_key_id(&c).is_some(), key_ids);
            assert_eq!(subject_key_id(&a).is_some(), key_ids);
            let found = path(&ek, &[&ca], &[]).unwrap_or_else(|e| panic!("key ids {key_ids}: {e}"));
            assert_eq!(found.anchor, "C=TW, CN=Maker EK CA");
            // As an intermediate under a root.
            let r = root("R", (2020, 2040));
            let (mid, key) = ca_named_by(subject.clone(), key_ids, Some(&r));
            let ek = leaf_from(written.clone(), key, key_ids);
            assert_eq!(path(&ek, &[&r.der], &[&mid]).unwrap().intermediates, 1);
        }
        // Another name and no key identifiers: not a candidate at all.
        let (ca, key) = ca_named(subject.clone(), false);
        let ek = leaf_from(
            dn(&[(DnType::CommonName, printable("Other CA"))]),
            key,
            false,
        );
        assert!(matches!(
            path(&ek, &[&ca], &[]),
            Err(ChainError::MissingIssuer { .. })
        ));
        // Another name, the key identifier matching: found by it.
        let (ca, key) = ca_named(subject, true);
        let ek = leaf_from(
            dn(&[(DnType::CommonName, printable("Other CA"))]),
            key,
            true,
        );
        path(&ek, &[&ca], &[]).unwrap();
    }

    /// No key identifiers anywhere: chained by name alone.
    #[test]
    fn no_key_identifiers_at_all() {
        let name = dn(&[(DnType::CommonName, printable("Bare Root"))]);
        let (ca, key) = ca_named(name.clone(), false);
        let ek = leaf_from(name, key, false);
        let (_, c) = X509Certificate::from_der(&ek).unwrap();
        assert!(authority_key_id(&c).is_none());
        assert_eq!(path(&ek, &[&ca], &[]).unwrap().anchor, "CN=Bare Root");
    }

    /// Serials longer than 20 octets and a `99991231235959Z` notAfter
    /// (the "no well-defined expiration" of RFC 5280) on every link.
    #[test]
    fn long_serials_and_the_undefined_expiry() {
        let forever = rcgen::date_time_ymd(9999, 12, 31) + std::time::Duration::from_secs(86_399);
        let serial = rcgen::SerialNumber::from_slice(&[0x4c; 32]);
        let key = KeyPair::generate().unwrap();
        let mut rp = ca_params("Forever Root", (2020, 2040));
        rp.not_after = forever;
        rp.serial_number = Some(serial.clone());
        let root_der = rp.self_signed(&key).unwrap().der().to_vec();
        let issuer = Issuer::new(rp, key);
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = forever;
        p.serial_number = Some(serial);
        let ek = p
            .signed_by(&KeyPair::generate().unwrap(), &issuer)
            .unwrap()
            .der()
            .to_vec();
        for der in [&root_der, &ek] {
            assert!(der.windows(15).any(|w| w == b"99991231235959Z"));
            let (_, c) = X509Certificate::from_der(der).unwrap();
            assert_eq!(c.raw_serial().len(), 32);
            assert!(valid_at(&c, at(2090, 1, 1)));
        }
        assert_eq!(
            path(&ek, &[&root_der], &[]).unwrap().anchor,
            "CN=Forever Root"
        );
        let leaf = parse(&[&ek]).remove(0);
        build_path(&leaf, &parse(&[&root_der]), &[], at(2500, 1, 1)).unwrap();
    }

    /// Any configured certificate is an anchor: an intermediate configured
    /// as one ends the path there, whatever is above it.
    #[test]
    fn an_anchor_need_not_be_self_signed() {
        let r = root("Maker Root", (2020, 2040));
        let i = sub("Maker EK CA 7", &r, None);
        let ek = leaf(&i);
        let found = path(&ek, &[&i.der], &[]).unwrap();
        assert_eq!(
            (found.anchor.as_str(), found.intermediates),
            ("CN=Maker EK CA 7", 0)
        );
        // An anchor is still checked as an issuer: an expired one refuses.
        let old = sub("Old EK CA", &r, Some(ca_params("Old EK CA", (2000, 2025))));
        let e = path(&leaf(&old), &[&old.der], &[]).unwrap_err();
        assert!(
            matches!(e, ChainError::Invalid(ref m) if m.contains("not valid")),
            "{e}"
        );
    }
}
