//! The cloud identity documents the control plane reads from a joining VM
//! (cloud-iid): GCP's identity token, AWS's instance identity document and
//! Azure's attested document's time stamps. Each body takes the verifier's
//! whole path with the test keys (tpmsim-fixtures) and, since a fuzzer
//! cannot forge a signature, also the part after the signature on its own
//! (the same functions `verify` calls), so the signed fields are fuzzed too.

use std::sync::OnceLock;

use bc_controlplane::attestors::cloud_iid::{aws, azure, gcp, CloudIdentity, Freshness};

use crate::fixtures::{self, AUDIENCE};
use crate::split_parts;

/// The database time the documents are judged at: 2026-01-01T00:00:00Z.
pub(crate) const NOW_MS: i64 = 1_767_225_600_000;
/// `[cloud_iid] max_age`'s default.
const MAX_AGE_MS: i64 = 10 * 60 * 1000;

fn fresh() -> Freshness {
    Freshness {
        now: NOW_MS,
        max_age_ms: MAX_AGE_MS,
    }
}

/// What any admitted identity must be: its provider's, with an account and
/// an instance that are not empty and cannot split the use subject.
fn check_identity(id: &CloudIdentity, provider: &str) {
    assert_eq!(id.provider, provider);
    for part in [&id.account, &id.instance] {
        assert!(!part.is_empty() && !part.contains('/'), "{id:?}");
    }
}

fn gcp_keys() -> Option<&'static gcp::GcpKeys> {
    static KEYS: OnceLock<Option<gcp::GcpKeys>> = OnceLock::new();
    KEYS.get_or_init(|| {
        gcp::parse_jwks(include_bytes!("../../tpmsim-fixtures/cloud-gcp-jwks.json")).ok()
    })
    .as_ref()
}

fn aws_keys() -> Option<&'static aws::AwsKeys> {
    static KEYS: OnceLock<Option<aws::AwsKeys>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = fixtures::scratch_dir().ok()?;
        let file = dir.path().join("aws.pem");
        std::fs::write(&file, include_bytes!("../../tpmsim-fixtures/cloud-aws.pem")).ok()?;
        aws::load_certificates(&file).ok()
    })
    .as_ref()
}

/// GCP's identity token. The first byte picks: even, the whole JWT through
/// `gcp::verify`; odd, the rest as the decoded claims, as if signed.
pub fn gcp_token(data: &[u8]) {
    let (Some((&which, rest)), Some(keys)) = (data.split_first(), gcp_keys()) else {
        return;
    };
    let result = if which % 2 == 0 {
        let Ok(jwt) = std::str::from_utf8(rest) else {
            return;
        };
        gcp::verify(keys, jwt, AUDIENCE, &fresh())
    } else {
        gcp::identity(rest, AUDIENCE, &fresh())
    };
    if let Ok(id) = result {
        check_identity(&id, "gcp");
    }
}

/// AWS's instance identity document. The first byte picks: 0, a document
/// and its signature (two parts) through `aws::verify`; 1, the PKCS#7 form
/// (base64) through it; 2, the rest as a verified document's JSON.
pub fn aws_document(data: &[u8]) {
    let (Some((&which, rest)), Some(keys)) = (data.split_first(), aws_keys()) else {
        return;
    };
    let result = match which % 3 {
        0 => {
            let [doc, sig] = split_parts(rest);
            let (Ok(doc), Ok(sig)) = (std::str::from_utf8(doc), std::str::from_utf8(sig)) else {
                return;
            };
            aws::verify(keys, doc, Some(sig))
        }
        1 => {
            let Ok(doc) = std::str::from_utf8(rest) else {
                return;
            };
            aws::verify(keys, doc, None)
        }
        _ => aws::identity(rest),
    };
    if let Ok(id) = result {
        check_identity(&id, "aws");
    }
}

/// Azure's attested document after its signature: the first byte picks:
/// even, the rest as one `timeStamp` value (`MM/DD/YY HH:MM:SS ±hhmm`);
/// odd, the rest as the signed JSON content (nonce, time stamps).
pub fn azure_document(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 1 {
        if let Ok(id) = azure::identity(rest, AUDIENCE, &fresh()) {
            check_identity(&id, "azure");
            assert!(id.zone.is_empty());
        }
        return;
    }
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Some(ms) = azure::time_stamp(text) else {
        return;
    };
    // Years 2000 to 2099, an offset of at most ±99:99 either way.
    let slack = (99 * 3600 + 99 * 60) * 1000;
    assert!(
        (946_684_800_000 - slack..4_102_444_800_000 + slack).contains(&ms),
        "{text:?} → {ms}"
    );
    assert_eq!(ms % 1000, 0, "{text:?}: whole seconds");
    // The same instant written in UTC reads back the same.
    let Ok(at) = time::OffsetDateTime::from_unix_timestamp(ms / 1000) else {
        return;
    };
    if (2000..2100).contains(&at.year()) {
        let utc = format!(
            "{:02}/{:02}/{:02} {:02}:{:02}:{:02} +0000",
            u8::from(at.month()),
            at.day(),
            at.year() - 2000,
            at.hour(),
            at.minute(),
            at.second()
        );
        assert_eq!(azure::time_stamp(&utc), Some(ms), "{text:?} as {utc:?}");
    }
}
