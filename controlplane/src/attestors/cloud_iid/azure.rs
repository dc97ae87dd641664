//! Azure: the attested document of the instance metadata service, a CMS
//! SignedData whose content is JSON (`vmId`, `subscriptionId`,
//! `timeStamp.createdOn/expiresOn`, `nonce`, `sku`, `plan`, …) signed by a
//! certificate it carries (`metadata.azure.com`).
//!
//! Checked in this order: the message parses with one signer and the
//! signer's certificate in it (`cloud-malformed`); the signature by that
//! certificate's key (`cloud-signature`, a wrong `messageDigest` too); the
//! certificate chains to `[cloud_iid.azure] roots` through carried or
//! configured intermediates, each valid at the database's time
//! (`cloud-chain`: its own reason, as a missing or rotated intermediate is
//! a configuration to fix, not a forgery); it names the configured signer
//! (`cloud-signer`); then, over signed content only, the nonce is the one
//! for `[cloud_iid] audience` (`cloud-audience`, see
//! [`bc_wire::cloud_iid::azure_nonce`]) and the time stamps are fresh
//! (`cloud-stale`, `cloud-future`).

use std::path::Path;

use serde::Deserialize;

use super::cms::Signed;
use super::{chain, CloudIdentity, CloudReason, Freshness};

/// The name Azure's attested documents are signed with (public cloud).
pub(crate) const DEFAULT_SIGNER: &str = "metadata.azure.com";

/// `[cloud_iid.azure]`: the roots and intermediates (DER) and the signer
/// name a document's certificate must bear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AzureTrust {
    pub roots: Vec<Vec<u8>>,
    pub intermediates: Vec<Vec<u8>>,
    pub signer: String,
}

impl AzureTrust {
    /// Reads the PEM bundles (`intermediates` optional: Azure's signer
    /// certificate may not carry its issuer).
    pub(crate) fn load(
        roots: &Path,
        intermediates: Option<&Path>,
        signer: String,
    ) -> Result<Self, String> {
        Ok(AzureTrust {
            roots: chain::load_bundle(roots)?,
            intermediates: intermediates
                .map(chain::load_bundle)
                .transpose()?
                .unwrap_or_default(),
            signer,
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    vm_id: String,
    subscription_id: String,
    nonce: Option<String>,
    time_stamp: TimeStamp,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimeStamp {
    created_on: String,
    expires_on: String,
}

pub(crate) fn verify(
    trust: &AzureTrust,
    document: &str,
    audience: &str,
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    let signed = Signed::from_base64(document)?;
    let cert = signed.signer_cert().ok_or(CloudReason::Malformed)?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert).map_err(|_| CloudReason::Malformed)?;
    signed.verify(parsed.tbs_certificate.subject_pki.raw)?;
    let intermediates: Vec<&[u8]> = signed
        .certs()
        .iter()
        .chain(&trust.intermediates)
        .map(Vec::as_slice)
        .collect();
    if !chain::verify(
        cert,
        &intermediates,
        &trust.roots,
        fresh.now.div_euclid(1000),
    ) {
        return Err(CloudReason::Chain);
    }
    if !chain::names(cert, &trust.signer) {
        return Err(CloudReason::Signer);
    }
    identity(signed.content(), audience, fresh)
}

/// The identity the signed `content` names, once its signature and chain
/// checked out: the nonce, the time stamps (public for the fuzzer).
pub fn identity(
    content: &[u8],
    audience: &str,
    fresh: &Freshness,
) -> Result<CloudIdentity, CloudReason> {
    let doc: Document = serde_json::from_slice(content).map_err(|_| CloudReason::Malformed)?;
    if doc.nonce.as_deref() != Some(bc_wire::cloud_iid::azure_nonce(audience).as_str()) {
        return Err(CloudReason::Audience);
    }
    let created = time_stamp(&doc.time_stamp.created_on).ok_or(CloudReason::Malformed)?;
    let expires = time_stamp(&doc.time_stamp.expires_on).ok_or(CloudReason::Malformed)?;
    fresh.check(created, expires)?;
    CloudIdentity::new(
        super::AZURE.to_owned(),
        doc.subscription_id,
        // The attested document names no location: Azure rows are per
        // subscription (`cloud resolve add` refuses a zone for azure).
        String::new(),
        doc.vm_id,
    )
}

/// Azure's `MM/DD/YY HH:MM:SS ±hhmm` (e.g. `11/30/20 21:19:19 -0000`), in
/// Unix milliseconds; years are 20YY.
pub fn time_stamp(s: &str) -> Option<i64> {
    let (date, rest) = s.split_once(' ')?;
    let (clock, offset) = rest.split_once(' ')?;
    let nums = |s: &str, sep: char| -> Option<Vec<u8>> {
        let v: Vec<u8> = s
            .split(sep)
            .map(|p| {
                (p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit())).then(|| p.parse().ok())?
            })
            .collect::<Option<_>>()?;
        (v.len() == 3).then_some(v)
    };
    let (d, c) = (nums(date, '/')?, nums(clock, ':')?);
    let month = time::Month::try_from(d[0]).ok()?;
    let date = time::Date::from_calendar_date(2000 + i32::from(d[2]), month, d[1]).ok()?;
    let clock = time::Time::from_hms(c[0], c[1], c[2]).ok()?;
    let (sign, hhmm) = match offset.as_bytes().first()? {
        b'+' => (1, &offset[1..]),
        b'-' => (-1, &offset[1..]),
        _ => return None,
    };
    if hhmm.len() != 4 || !hhmm.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m): (i64, i64) = (hhmm[..2].parse().ok()?, hhmm[2..].parse().ok()?);
    let local = date.with_time(clock).assume_utc().unix_timestamp();
    Some((local - sign * (h * 3600 + m * 60)) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_stamps() {
        assert_eq!(
            time_stamp("11/30/20 21:19:19 -0000"),
            Some(1_606_771_159_000)
        );
        assert_eq!(
            time_stamp("11/30/20 22:19:19 +0100"),
            Some(1_606_771_159_000)
        );
        for bad in [
            "",
            "11/30/20",
            "13/30/20 21:19:19 -0000",
            "11/31/20 21:19:19 -0000",
            "11/30/20 24:00:00 -0000",
            "11/30/2020 21:19:19 -0000",
            "11/30/20 21:19:19 0000",
            "11/30/20 21:19:19 -00:00",
            "1/30/20 21:19:19 -0000",
            "+1/30/20 21:19:19 -0000",
            "11/30/20 21:19:19 -0000 x",
        ] {
            assert_eq!(time_stamp(bad), None, "{bad}");
        }
    }
}
