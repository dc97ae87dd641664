//! A certification path from an EK certificate to a configured anchor.
//!
//! Makers issue EK certificates from intermediates (many per maker, per
//! platform, per security version) and operators configure the maker's
//! root. The intermediates come from wherever they can be found and none is
//! trusted: each link is verified (subject/issuer names, the issuer's
//! signature, CA basicConstraints, keyCertSign, pathLenConstraint, validity
//! at the given time). The walk stops at the first anchor that verifies,
//! so an expired or cross-signed root above it never refuses a valid path,
//! and it backtracks over candidates sharing a name (a re-keyed CA, a
//! cross-certificate), anchors first.
//!
//! The work is bounded for input an unauthenticated agent chooses: at most
//! [`MAX_DEPTH`] issuers above the EK certificate and at most
//! [`MAX_SIGNATURE_CHECKS`] signature verifications per path.

use x509_parser::certificate::X509Certificate;

/// Most CA certificates above the EK certificate, the anchor included.
pub const MAX_DEPTH: usize = 4;
/// Most signature verifications one path search may make.
pub const MAX_SIGNATURE_CHECKS: usize = 32;

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
        for anchor in anchors.iter().filter(|a| names_issuer(a, child)) {
            named = true;
            if self.verified(child, anchor) && self.usable_issuer(anchor, depth) {
                return Some(Anchored {
                    anchor: anchor.subject().to_string(),
                    intermediates: depth,
                });
            }
        }
        let intermediates = self.intermediates;
        for (i, ca) in intermediates.iter().enumerate() {
            if used.contains(&i) || !names_issuer(ca, child) {
                continue;
            }
            named = true;
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

fn names_issuer(ca: &X509Certificate<'_>, child: &X509Certificate<'_>) -> bool {
    ca.subject().as_raw() == child.issuer().as_raw()
}

/// Whether `cert` is valid at `now_s`.
pub fn valid_at(cert: &X509Certificate<'_>, now_s: i64) -> bool {
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
}
