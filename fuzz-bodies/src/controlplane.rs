//! What the control plane reads from the network (Join and Renew request
//! bodies, through the real `JoinService` on a real SQLite file), from its
//! DIR (`controlplane.toml`) and from a TPM (the EK certificate).

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use bc_controlplane::attestors::tpm::ek;
use bc_controlplane::pki::NodeCertSpec;
use bc_controlplane::store::{self, UnixMs};
use bc_controlplane::{records, ControlPlane, JoinService, RenewService};

use crate::{fixtures, split_parts};

/// A control plane DIR the way `init` makes one, whose challenge key and
/// EK roots are the captured TPM's, and whose clock stands at the capture:
/// so the captured round 2 still verifies, and the fuzzer can reach every
/// check after it. It also knows node `node_fuzz`, certified with the
/// captured AK's statement, for Renew. Every attestor runs: cloud-iid with
/// the test GCP and AWS keys, and a resolve row for each of their test
/// accounts ([`CLOUD_ACCOUNT`]), so a signed document reaches the use
/// check.
struct Cp {
    dir: tempfile::TempDir,
    svc: ControlPlane,
    /// The leaf of `node_fuzz` (DER), which Renew is called with.
    leaf: Vec<u8>,
    /// Inputs run since the clock was last put back.
    runs: u32,
}

/// The database is replaced when it grows past this (every refusal is an
/// event row).
const MAX_DB_BYTES: u64 = 64 << 20;
/// How many inputs run between two clock resets and size checks.
const CHECK_EVERY: u32 = 2048;

impl Cp {
    fn new() -> Result<Cp, String> {
        let dir = fixtures::scratch_dir().map_err(|e| e.to_string())?;
        bc_controlplane::pki::init(dir.path(), fixtures::TRUST_DOMAIN)
            .map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("challenge.key"), fixtures::CHALLENGE_KEY)
            .map_err(|e| e.to_string())?;
        cloud_iid_config(dir.path())?;
        let svc = ControlPlane::open(dir.path()).map_err(|e| e.to_string())?;
        for provider in ["gcp", "aws"] {
            svc.database()
                .write(|tx| {
                    bc_controlplane::attestors::cloud_iid::resolve::add(
                        tx,
                        &bc_controlplane::attestors::cloud_iid::resolve::NewRow {
                            provider,
                            account: CLOUD_ACCOUNT,
                            zone: None,
                            pool: None,
                            roles: &[],
                            site: None,
                        },
                        0,
                    )
                })
                .map_err(|e| e.to_string())?;
        }
        let mut roots = ek::parse_roots_pem(fixtures::EK_ROOT_PEM).map_err(|e| e.to_string())?;
        roots
            .extend(ek::parse_roots_pem(fixtures::EK_INTERMEDIATE_PEM).map_err(|e| e.to_string())?);
        ek::add_roots(svc.database(), &roots, ek::RootKind::Anchor).map_err(|e| e.to_string())?;
        let mut cp = Cp {
            dir,
            svc,
            leaf: Vec::new(),
            runs: 0,
        };
        cp.set_clock()?;
        cp.leaf = cp.tpm_node()?;
        Ok(cp)
    }

    /// Puts the database clock one second after the capture.
    fn set_clock(&self) -> Result<(), String> {
        let now = time::OffsetDateTime::now_utc();
        let real: UnixMs = store::from_datetime(now);
        let offset = fixtures::captured_at() + 1_000 - real;
        self.svc
            .database()
            .write(|tx| store::set_clock_offset_ms(tx, offset))
            .map_err(|e| e.to_string())
    }

    /// Inserts `node_fuzz`, as a TPM join of the captured machine would,
    /// with a certificate for the captured node key; its DER.
    fn tpm_node(&self) -> Result<Vec<u8>, String> {
        use bc_wire::agent::{tpm_attestation::Round, TpmAttestation};
        use prost::Message;
        let Some(Round::Hello(hello)) = TpmAttestation::decode(fixtures::TPM_HELLO)
            .map_err(|e| e.to_string())?
            .round
        else {
            return Err("hello.bin is not a hello".into());
        };
        let ak = bc_wire::tpm::Public::parse(&hello.ak_public).map_err(|e| e.to_string())?;
        let statement = bc_wire::tpm::ak_statement(&ak.name()).map_err(|e| e.to_string())?;
        let spki = { csr_spki(fixtures::TPM_CSR)? };
        let db = self.svc.database();
        let now = db.read(|tx| tx.now()).map_err(|e| e.to_string())?;
        let not_before = store::to_datetime(now - now.rem_euclid(1000));
        let issued = self
            .svc
            .bundle()
            .node_ca
            .issue(&NodeCertSpec {
                spki_der: &spki,
                trust_domain: fixtures::TRUST_DOMAIN,
                node_id: fixtures::NODE_ID,
                statements: &[statement],
                not_before,
                not_after: not_before + time::Duration::days(30),
            })
            .map_err(|e| e.to_string())?;
        db.write(|tx| {
            records::insert_node(
                tx,
                &records::NodeRow {
                    id: fixtures::NODE_ID.to_owned(),
                    role: bc_wire::agent::Role::Node,
                    identity_generation: 1,
                    attestor: bc_wire::AttestorId::Tpm,
                    joined_at: now,
                    retired_at: None,
                    pool_id: bc_controlplane::pools::DEFAULT_POOL.to_owned(),
                    cordoned_at: None,
                    deleted_at: None,
                },
            )?;
            records::insert_cert(tx, fixtures::NODE_ID, 1, &issued)
        })
        .map_err(|e| e.to_string())?;
        Ok(issued.der)
    }

    /// Counts a run; every [`CHECK_EVERY`] runs puts the clock back and
    /// replaces a database grown too big.
    fn tick(slot: &mut Option<Cp>) {
        let Some(cp) = slot.as_mut() else {
            *slot = Cp::new().ok();
            return;
        };
        cp.runs += 1;
        if cp.runs < CHECK_EVERY {
            return;
        }
        cp.runs = 0;
        let size = std::fs::metadata(cp.dir.path().join("controlplane.db")).map_or(0, |m| m.len())
            + std::fs::metadata(cp.dir.path().join("controlplane.db-wal")).map_or(0, |m| m.len());
        if size > MAX_DB_BYTES || cp.set_clock().is_err() {
            *slot = None;
            *slot = Cp::new().ok();
        }
    }
}

/// The account (GCP project, AWS account) of the cloud-iid seeds, resolved
/// to the default pool.
pub(crate) const CLOUD_ACCOUNT: &str = "proj-fuzz";

/// `[cloud_iid]` with GCP and AWS and the test keys, into `dir`.
fn cloud_iid_config(dir: &Path) -> Result<(), String> {
    let w =
        |name: &str, data: &[u8]| std::fs::write(dir.join(name), data).map_err(|e| e.to_string());
    w(
        "gcp-jwks.json",
        include_bytes!("../../tpmsim-fixtures/cloud-gcp-jwks.json"),
    )?;
    w(
        "aws-certs.pem",
        include_bytes!("../../tpmsim-fixtures/cloud-aws.pem"),
    )?;
    let file = dir.join("controlplane.toml");
    let mut config = std::fs::read_to_string(&file).unwrap_or_default();
    config.push_str(&format!(
        "\n[cloud_iid]\naudience = \"{}\"\n[cloud_iid.gcp]\njwks = \"gcp-jwks.json\"\n[cloud_iid.aws]\ncertificates = \"aws-certs.pem\"\n\
         [tpm.ek_services.intel]\nurl = \"\"\n[tpm.ek_services.amd]\nurl = \"\"\n",
        fixtures::AUDIENCE
    ));
    w("controlplane.toml", config.as_bytes())
}

fn csr_spki(der: &[u8]) -> Result<Vec<u8>, String> {
    use x509_parser::prelude::FromDer;
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(der)
        .map_err(|e| e.to_string())?;
    Ok(csr.certification_request_info.subject_pki.raw.to_vec())
}

fn with_cp(f: impl FnOnce(&Cp)) {
    static CP: OnceLock<Mutex<Option<Cp>>> = OnceLock::new();
    let mut slot = CP
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Cp::tick(&mut slot);
    if let Some(cp) = slot.as_ref() {
        f(cp);
    }
}

/// A `Join` request body, as the HTTPS layer hands it to the JoinService.
pub fn join_request(data: &[u8]) {
    with_cp(|cp| {
        let _ = JoinService::new(&cp.svc).join_bytes(data, None);
    });
}

/// A `Renew` request body from the TLS client `node_fuzz` (whose
/// certificate carries the captured AK's statement).
pub fn renew_request(data: &[u8]) {
    with_cp(|cp| {
        let _ = RenewService::new(&cp.svc).renew_bytes(Some(&cp.leaf), data);
    });
}

/// `controlplane.toml`.
pub fn cp_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = bc_controlplane::config::parse(Path::new("/var/lib/bc/controlplane.toml"), text);
}

/// An EK certificate and EK public area, as a TPM hello carries them,
/// verified against the test maker's roots at the capture's time.
pub fn ek_cert(data: &[u8]) {
    static ROOTS: OnceLock<ek::EkTrust> = OnceLock::new();
    let roots = ROOTS.get_or_init(|| {
        let mut roots = ek::parse_roots_pem(fixtures::EK_ROOT_PEM).unwrap_or_default();
        roots.extend(ek::parse_roots_pem(fixtures::EK_INTERMEDIATE_PEM).unwrap_or_default());
        ek::EkTrust::anchors(roots)
    });
    let [cert, public] = split_parts(data);
    let _ = ek::verify_ek(cert, public, roots, &[], fixtures::captured_at());
}

/// A CMS SignedData (Azure's attested document, AWS's PKCS#7 form), DER
/// or BER: parsed, and its signature checked with the OpenSSL sample's
/// signer key when it parses.
pub fn cloud_cms(data: &[u8]) {
    use bc_controlplane::attestors::cloud_iid::cms::Signed;
    static SPKI: OnceLock<Vec<u8>> = OnceLock::new();
    let spki = SPKI.get_or_init(|| {
        let pem = include_bytes!("../../controlplane/testdata/cms/signer.pem");
        let der = rustls_pemfile::certs(&mut &pem[..]).next();
        let der = der
            .and_then(Result::ok)
            .map(|d| d.to_vec())
            .unwrap_or_default();
        x509_parser::parse_x509_certificate(&der)
            .map(|(_, c)| c.tbs_certificate.subject_pki.raw.to_vec())
            .unwrap_or_default()
    });
    if let Ok(signed) = Signed::from_der(data) {
        let _ = signed.verify(spki);
        let _ = (signed.content(), signed.signer_cert(), signed.certs());
    }
}

/// The outcomes of a Join and a Renew on the harness, for the test that
/// the seeds still reach past the checks the fixtures are made to pass.
#[cfg(test)]
pub(crate) fn harness_outcomes(join: &[u8], renew: &[u8]) -> Result<(bool, bool), String> {
    let cp = Cp::new()?;
    let joined = JoinService::new(&cp.svc)
        .join_bytes(join, None)
        .map_err(|e| format!("join: {e:?}"))?;
    let renewed = RenewService::new(&cp.svc)
        .renew_bytes(Some(&cp.leaf), renew)
        .is_ok();
    Ok((!joined.body.is_empty(), renewed))
}

/// A boot policy an operator writes, as a pool stores it (`dbx_min` files
/// refused: the parse must not open paths a mutated input names). What
/// parses must survive `to_toml` (what a pool stores) unchanged.
pub fn boot_policy(data: &[u8]) {
    use bc_controlplane::boot_policy::BootPolicy;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = BootPolicy::parse_stored(text) else {
        return;
    };
    let stored = policy.to_toml();
    match BootPolicy::parse_stored(&stored) {
        Ok(again) => assert_eq!(again, policy, "stored as:\n{stored}"),
        Err(e) => panic!("to_toml's output does not parse: {e}\n{stored}"),
    }
}
