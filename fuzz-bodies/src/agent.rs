//! What bcd reads from the network (join and renewal answers), the disk
//! (`identity.json`) and the command line (the config file it is pointed at).

use std::path::Path;
use std::sync::OnceLock;

use bc_wire::agent::{JoinResponse, RenewResponse};
use bcd::client::answer::{self, Expected};
use bcd::client::renew::{self, RenewExpected};
use prost::Message;

use crate::fixtures;

/// A join answer. First byte even: the rest is a `JoinResponse` as it came
/// off the wire, opened with the pinned key. Odd: the rest is a
/// `JoinResponseBody` whose signature passed, so the fuzzer spends its runs
/// on the body and the certificate chain rather than on failing signatures.
pub fn join_answer(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let node_spki = fixtures::node_spki();
    let expected = Expected {
        signing_key: fixtures::service_key().verifying_key(),
        csr_sha256: bc_wire::sha256(fixtures::AGENT_CSR),
        node_spki,
        trust_domain: fixtures::TRUST_DOMAIN,
    };
    let opened = if mode & 1 == 0 {
        match JoinResponse::decode(rest) {
            Ok(resp) => answer::open(&resp, &expected),
            Err(_) => return,
        }
    } else {
        answer::read_body(rest, &expected)
    };
    if let Ok(opened) = opened {
        if let Ok(accepted) = answer::verify_final(opened, &expected) {
            assert_eq!(accepted.cert.spki, node_spki);
            assert_eq!(accepted.cert.id.trust_domain, fixtures::TRUST_DOMAIN);
        }
    }
}

/// A `RenewResponse` body, checked as bcd checks a renewal of node
/// `node_fuzz` that carries an AK statement forward.
pub fn renew_answer(data: &[u8]) {
    let Ok(resp) = RenewResponse::decode(data) else {
        return;
    };
    let next_spki = fixtures::node_spki();
    let expected = RenewExpected {
        node_id: fixtures::NODE_ID,
        trust_domain: fixtures::TRUST_DOMAIN,
        next_spki,
        statement: Some(AK_STATEMENT),
        // No CA to check the leaf against: a mutated leaf never carries a
        // valid signature, so the checks after that one would go unfuzzed.
        issuer: None,
        now: time::OffsetDateTime::from_unix_timestamp(RENEW_NOW)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
    };
    if let Ok(cert) = renew::verify_answer(&resp.chain, &expected) {
        assert_eq!(cert.id.node_id, fixtures::NODE_ID);
    }
}

/// The statement [`renew_answer`] expects carried forward.
pub(crate) const AK_STATEMENT: &str =
    "urn:bc:tpm-ak:sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The time [`renew_answer`] judges at (2026-11-30T23:00Z): the seeds'
/// certificates are valid then.
pub(crate) const RENEW_NOW: i64 = 1_796_079_600;

/// `identity.json`, loaded from a data directory as `bcd status` does (no
/// repair, no TPM unless the file names one).
pub fn identity_json(data: &[u8]) {
    static DIR: OnceLock<Option<tempfile::TempDir>> = OnceLock::new();
    let Some(dir) = DIR.get_or_init(|| crate::fixtures::scratch_dir().ok()) else {
        return;
    };
    if std::fs::write(dir.path().join("identity.json"), data).is_err() {
        return;
    }
    let tpm = bcd::keys::TpmAccess::none();
    let _ = bcd::identity::Identity::inspect(dir.path(), &tpm);
}

/// bcd's configuration file.
pub fn bcd_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = bcd::config::Config::parse(Path::new("/etc/bcd/config.toml"), text);
}
