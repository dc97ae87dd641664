//! The control plane's PKI bundle: what `init` writes into DIR and what
//! `serve` loads back.
//!
//! DIR holds, besides `controlplane.db`:
//!
//! | file | what |
//! |---|---|
//! | `trust-domain` | the SPIFFE trust domain, one line |
//! | `node-ca.pem` / `node-ca.key` | the node CA (P-256, pathlen 0) that signs node certificates |
//! | `join-signing.key` / `join-signing.pub` | the JoinService signing key (PKCS#8 / SPKI PEM) |
//! | `join-encryption.key` / `join-encryption.pub` | the key join tokens are sealed to |
//! | `tls-ca.pem` / `tls-ca.key` | the CA of the HTTPS server certificate (agents pin `tls-ca.pem`) |
//! | `tls-server.pem` / `tls-server.key` | the HTTPS server certificate: `localhost`, 127.0.0.1, ::1 |
//! | `challenge.key` | 32 random bytes: the AES-256-GCM key of the tpm attestor's challenge states |
//!
//! Private keys are 0600 and DIR is 0700.

use std::path::{Path, PathBuf};

use base64::Engine;
use p256::pkcs8::{DecodePrivateKey, EncodePublicKey};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};

use crate::fsutil;

pub const TRUST_DOMAIN_FILE: &str = "trust-domain";
pub(crate) const NODE_CA_CERT: &str = "node-ca.pem";
pub(crate) const NODE_CA_KEY: &str = "node-ca.key";
pub(crate) const JOIN_SIGNING_KEY: &str = "join-signing.key";
pub(crate) const JOIN_SIGNING_PUB: &str = "join-signing.pub";
pub(crate) const JOIN_ENCRYPTION_KEY: &str = "join-encryption.key";
pub(crate) const JOIN_ENCRYPTION_PUB: &str = "join-encryption.pub";
pub const TLS_CA_CERT: &str = "tls-ca.pem";
pub(crate) const TLS_CA_KEY: &str = "tls-ca.key";
pub(crate) const TLS_SERVER_CERT: &str = "tls-server.pem";
pub(crate) const TLS_SERVER_KEY: &str = "tls-server.key";
/// The tpm attestor's `challengeKey`: every replica serving DIR shares it,
/// so any of them can open a challenge state another one sealed.
pub(crate) const CHALLENGE_KEY: &str = "challenge.key";
pub(crate) const CHALLENGE_KEY_LEN: usize = 32;

/// Every file of a bundle; `init` refuses a DIR holding any of them.
pub(crate) const BUNDLE_FILES: &[&str] = &[
    TRUST_DOMAIN_FILE,
    NODE_CA_CERT,
    NODE_CA_KEY,
    JOIN_SIGNING_KEY,
    JOIN_SIGNING_PUB,
    JOIN_ENCRYPTION_KEY,
    JOIN_ENCRYPTION_PUB,
    TLS_CA_CERT,
    TLS_CA_KEY,
    TLS_SERVER_CERT,
    TLS_SERVER_KEY,
    CHALLENGE_KEY,
];

pub const DEFAULT_TRUST_DOMAIN: &str = "bc.test";

/// Longest node certificate lifetime the control plane ever issues.
pub(crate) const MAX_NODE_CERT_TTL: Duration = Duration::hours(24);

const PRIVATE_MODE: u32 = 0o600;
const PUBLIC_MODE: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{0} already holds a control plane bundle ({1} exists); use another directory or remove it"
    )]
    Exists(PathBuf, String),
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error(transparent)]
    TrustDomain(#[from] bc_wire::spiffe::SpiffeError),
    #[error("generating {what}: {detail}")]
    Generate { what: &'static str, detail: String },
    #[error("issuing a node certificate: {0}")]
    Issue(String),
}

/// The node CA: signs node certificates.
pub struct NodeCa {
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

/// What to put into a node certificate. The subject and SANs come from here
/// only: a CSR never chooses them.
pub struct NodeCertSpec<'a> {
    /// SubjectPublicKeyInfo (DER) of the node key, from the verified CSR.
    pub spki_der: &'a [u8],
    pub trust_domain: &'a str,
    pub node_id: &'a str,
    /// `urn:bc:` statements that follow the SPIFFE ID (e.g. the TPM AK), in order.
    pub statements: &'a [String],
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// An issued node certificate.
pub struct IssuedCert {
    /// Lowercase hex of the serial number.
    pub(crate) serial_hex: String,
    pub der: Vec<u8>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl NodeCa {
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Issues a node certificate: CN = node id, exactly one SPIFFE ID URI SAN
    /// followed by the statements, digitalSignature (critical), clientAuth +
    /// serverAuth, CA:false, a random positive 16-byte serial.
    pub fn issue(&self, spec: &NodeCertSpec<'_>) -> Result<IssuedCert, PkiError> {
        let spiffe = bc_wire::spiffe::NodeSpiffeId::new(spec.trust_domain, spec.node_id)?;
        // At most four URIs in all, the SPIFFE ID first (see wire/README.md).
        if spec.statements.len() > 3 || spec.statements.iter().any(|s| !s.starts_with("urn:bc:")) {
            return Err(PkiError::Issue(
                "statements must be at most three urn:bc: URIs".into(),
            ));
        }
        let not_before = spec.not_before.max(self.not_before);
        let not_after = spec
            .not_after
            .min(self.not_after)
            .min(spec.not_before + MAX_NODE_CERT_TTL);
        if not_after <= not_before {
            return Err(PkiError::Issue("the validity window is empty".into()));
        }
        let public = rcgen::SubjectPublicKeyInfo::from_der(spec.spki_der)
            .map_err(|e| PkiError::Issue(format!("node key: {e}")))?;
        let serial = random_serial()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, spec.node_id);
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.not_before = not_before;
        params.not_after = not_after;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.subject_alt_names = std::iter::once(spiffe.to_string())
            .chain(spec.statements.iter().cloned())
            .map(|uri| {
                rcgen::string::Ia5String::try_from(uri)
                    .map(SanType::URI)
                    .map_err(|e| PkiError::Issue(format!("URI SAN: {e}")))
            })
            .collect::<Result<_, _>>()?;
        let cert = params
            .signed_by(&public, &self.issuer)
            .map_err(|e| PkiError::Issue(e.to_string()))?;
        Ok(IssuedCert {
            serial_hex: hex::encode(serial),
            der: cert.der().to_vec(),
            not_before,
            not_after,
        })
    }
}

/// What a node certificate says about its holder, read back from its DER.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCertIdentity {
    pub trust_domain: String,
    /// From the one SPIFFE ID, never from a statement.
    pub node_id: String,
    /// The `urn:bc:` statements after the SPIFFE ID, in order.
    pub statements: Vec<String>,
    /// The certified key's SubjectPublicKeyInfo, DER.
    pub spki_der: Vec<u8>,
}

/// Why a certificate is not a node certificate of the expected shape.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeCertError {
    #[error("not an X.509 certificate in DER")]
    NotDer,
    #[error(
        "its URI SANs are not one node SPIFFE ID followed by at most three urn:bc: statements"
    )]
    Uris,
}

/// Reads a node certificate's identity: its URI SANs must be exactly one
/// node SPIFFE ID followed only by `urn:bc:` statements (at most four URIs
/// in all), the profile [`NodeCa::issue`] writes. Readers take the node id
/// from the SPIFFE ID alone, so a statement can never pose as an identity.
pub fn node_cert_identity(der: &[u8]) -> Result<NodeCertIdentity, NodeCertError> {
    use x509_parser::extensions::GeneralName;
    let (rest, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| NodeCertError::NotDer)?;
    if !rest.is_empty() {
        return Err(NodeCertError::NotDer);
    }
    let san = cert
        .subject_alternative_name()
        .map_err(|_| NodeCertError::Uris)?
        .ok_or(NodeCertError::Uris)?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    let (first, statements) = uris.split_first().ok_or(NodeCertError::Uris)?;
    let id = bc_wire::spiffe::NodeSpiffeId::parse(first).map_err(|_| NodeCertError::Uris)?;
    if statements.len() > 3 || statements.iter().any(|s| !s.starts_with("urn:bc:")) {
        return Err(NodeCertError::Uris);
    }
    Ok(NodeCertIdentity {
        trust_domain: id.trust_domain,
        node_id: id.node_id,
        statements: statements.iter().map(|s| (*s).to_owned()).collect(),
        spki_der: cert.public_key().raw.to_vec(),
    })
}

/// Everything `serve` needs, loaded from DIR.
pub struct Bundle {
    pub dir: PathBuf,
    pub trust_domain: String,
    pub node_ca: NodeCa,
    join_signing: p256::ecdsa::SigningKey,
    join_signing_spki_der: Vec<u8>,
    join_opening: bc_wire::sealing::OpeningKey,
    join_encryption_spki_der: Vec<u8>,
    tls_ca_der: Vec<u8>,
    tls_server_chain: Vec<CertificateDer<'static>>,
    tls_server_key: PrivatePkcs8KeyDer<'static>,
}

impl Bundle {
    /// Reads DIR back; every error names the file it is about.
    pub fn load(dir: &Path) -> Result<Self, PkiError> {
        let td_path = dir.join(TRUST_DOMAIN_FILE);
        let trust_domain = read(&td_path)?;
        let trust_domain = String::from_utf8(trust_domain)
            .map_err(|_| invalid(&td_path, "not UTF-8"))?
            .trim()
            .to_owned();
        bc_wire::spiffe::check_trust_domain(&trust_domain)
            .map_err(|e| invalid(&td_path, &e.to_string()))?;

        let node_ca = load_node_ca(dir)?;

        let (sign_path, sign_der) = read_pem(dir, JOIN_SIGNING_KEY, Kind::Pkcs8)?;
        let join_signing = p256::ecdsa::SigningKey::from_pkcs8_der(&sign_der)
            .map_err(|_| invalid(&sign_path, "not a P-256 PKCS#8 private key"))?;
        let (sign_pub_path, join_signing_spki_der) = read_pem(dir, JOIN_SIGNING_PUB, Kind::Spki)?;
        let derived = join_signing
            .verifying_key()
            .to_public_key_der()
            .map_err(|_| invalid(&sign_path, "cannot encode its public key"))?;
        if derived.as_bytes() != join_signing_spki_der.as_slice() {
            return Err(invalid(
                &sign_pub_path,
                &format!("does not match {JOIN_SIGNING_KEY}"),
            ));
        }

        let (enc_path, enc_der) = read_pem(dir, JOIN_ENCRYPTION_KEY, Kind::Pkcs8)?;
        let join_opening = bc_wire::sealing::OpeningKey::from_pkcs8_der(&enc_der)
            .map_err(|_| invalid(&enc_path, "not a P-256 PKCS#8 private key"))?;
        let enc_public = p256::SecretKey::from_pkcs8_der(&enc_der)
            .map_err(|_| invalid(&enc_path, "not a P-256 PKCS#8 private key"))?
            .public_key()
            .to_public_key_der()
            .map_err(|_| invalid(&enc_path, "cannot encode its public key"))?;
        let (enc_pub_path, join_encryption_spki_der) =
            read_pem(dir, JOIN_ENCRYPTION_PUB, Kind::Spki)?;
        if enc_public.as_bytes() != join_encryption_spki_der.as_slice() {
            return Err(invalid(
                &enc_pub_path,
                &format!("does not match {JOIN_ENCRYPTION_KEY}"),
            ));
        }

        let (_, tls_ca_der) = read_pem(dir, TLS_CA_CERT, Kind::Cert)?;
        let (_, tls_server_der) = read_pem(dir, TLS_SERVER_CERT, Kind::Cert)?;
        let (_, tls_key_der) = read_pem(dir, TLS_SERVER_KEY, Kind::Pkcs8)?;
        Ok(Bundle {
            dir: dir.to_owned(),
            trust_domain,
            node_ca,
            join_signing,
            join_signing_spki_der,
            join_opening,
            join_encryption_spki_der,
            tls_ca_der: tls_ca_der.clone(),
            tls_server_chain: vec![
                CertificateDer::from(tls_server_der),
                CertificateDer::from(tls_ca_der),
            ],
            tls_server_key: PrivatePkcs8KeyDer::from(tls_key_der),
        })
    }

    /// The JoinService signing key (signs every `JoinResponseBody`).
    pub(crate) fn join_signing_key(&self) -> &p256::ecdsa::SigningKey {
        &self.join_signing
    }

    /// SPKI DER of the signing key; its SHA-256 is the response `key_id`.
    pub(crate) fn join_signing_spki_der(&self) -> &[u8] {
        &self.join_signing_spki_der
    }

    pub(crate) fn join_opening_key(&self) -> &bc_wire::sealing::OpeningKey {
        &self.join_opening
    }

    /// SPKI DER of the key agents seal join tokens to.
    pub fn join_encryption_spki_der(&self) -> &[u8] {
        &self.join_encryption_spki_der
    }

    /// The TLS CA certificate agents pin (`tls-ca.pem`).
    pub fn tls_ca_der(&self) -> &[u8] {
        &self.tls_ca_der
    }

    /// The HTTPS server chain (leaf, TLS CA) and key.
    pub fn tls_server_identity(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            self.tls_server_chain.clone(),
            PrivateKeyDer::Pkcs8(self.tls_server_key.clone_key()),
        )
    }

    /// `tls-ca.pem`, `join-signing.pub` and `join-encryption.pub` as PEM, for
    /// an agent's config.
    pub fn agent_pins_pem(&self) -> AgentPins {
        AgentPins {
            server_ca: pem_encode("CERTIFICATE", &self.tls_ca_der),
            join_signing_key: pem_encode("PUBLIC KEY", &self.join_signing_spki_der),
            join_encryption_key: pem_encode("PUBLIC KEY", &self.join_encryption_spki_der),
        }
    }
}

/// The PEM an agent pins.
pub struct AgentPins {
    pub server_ca: String,
    pub join_signing_key: String,
    pub join_encryption_key: String,
}

/// Writes a fresh bundle into `dir`. Refuses a DIR that already holds any
/// bundle file, so a second `init` can never replace the keys of a running
/// control plane.
pub fn init(dir: &Path, trust_domain: &str) -> Result<(), PkiError> {
    init_with_sans(dir, trust_domain, &[])
}

/// [`init`], adding `extra_sans` (host names or IP addresses) to the TLS
/// server certificate beside localhost, 127.0.0.1 and ::1, so agents can
/// reach the control plane at the address they see (a PXE guest behind
/// QEMU's user network sees the host as 10.0.2.2).
pub fn init_with_sans(
    dir: &Path,
    trust_domain: &str,
    extra_sans: &[String],
) -> Result<(), PkiError> {
    bc_wire::spiffe::check_trust_domain(trust_domain)?;
    for san in extra_sans {
        check_san(san)?;
    }
    fsutil::ensure_private_dir(dir).map_err(|e| io_err(dir, e))?;
    for name in BUNDLE_FILES {
        let p = dir.join(name);
        if p.symlink_metadata().is_ok() {
            return Err(PkiError::Exists(dir.to_owned(), (*name).to_owned()));
        }
    }
    let now = OffsetDateTime::now_utc();

    // The CAs reach a year into the past: tests move the database clock
    // backwards, and a node certificate issued then must still nest inside
    // its CA's validity.
    let ca_not_before = now - Duration::days(365);
    let ca_not_after = now + Duration::days(3650);

    let node_ca_key = generate_key("the node CA key")?;
    let node_ca_params = ca_params(
        &format!("bc node CA ({trust_domain})"),
        ca_not_before,
        ca_not_after,
    )?;
    let node_ca_cert = node_ca_params
        .self_signed(&node_ca_key)
        .map_err(|e| gen_err("the node CA", e))?;

    let join_signing = generate_key("the join signing key")?;
    let (enc_der, enc_spki) =
        bc_wire::sealing::generate_keypair().map_err(|e| PkiError::Generate {
            what: "the join encryption key",
            detail: e.to_string(),
        })?;

    let tls_ca_key = generate_key("the TLS CA key")?;
    let tls_ca_params = ca_params("bc control plane TLS CA", ca_not_before, ca_not_after)?;
    let tls_ca_cert = tls_ca_params
        .self_signed(&tls_ca_key)
        .map_err(|e| gen_err("the TLS CA", e))?;
    let tls_issuer = Issuer::new(tls_ca_params, &tls_ca_key);
    let tls_key = generate_key("the TLS server key")?;
    let tls_cert = tls_server_params(
        now - Duration::hours(1),
        now + Duration::days(3650),
        extra_sans,
    )?
    .signed_by(&tls_key, &tls_issuer)
    .map_err(|e| gen_err("the TLS server certificate", e))?;

    let challenge_key: [u8; CHALLENGE_KEY_LEN] =
        crate::ids::random_bytes().map_err(|e| PkiError::Generate {
            what: "the challenge key",
            detail: e.to_string(),
        })?;
    let p = dir.join(CHALLENGE_KEY);
    fsutil::write_atomic(&p, &challenge_key, PRIVATE_MODE).map_err(|e| io_err(&p, e))?;

    let files: [(&str, String, u32); 11] = [
        (NODE_CA_KEY, node_ca_key.serialize_pem(), PRIVATE_MODE),
        (
            NODE_CA_CERT,
            pem_encode("CERTIFICATE", node_ca_cert.der()),
            PUBLIC_MODE,
        ),
        (JOIN_SIGNING_KEY, join_signing.serialize_pem(), PRIVATE_MODE),
        (JOIN_SIGNING_PUB, join_signing.public_key_pem(), PUBLIC_MODE),
        (
            JOIN_ENCRYPTION_KEY,
            pem_encode("PRIVATE KEY", &enc_der),
            PRIVATE_MODE,
        ),
        (
            JOIN_ENCRYPTION_PUB,
            pem_encode("PUBLIC KEY", &enc_spki),
            PUBLIC_MODE,
        ),
        (TLS_CA_KEY, tls_ca_key.serialize_pem(), PRIVATE_MODE),
        (
            TLS_CA_CERT,
            pem_encode("CERTIFICATE", tls_ca_cert.der()),
            PUBLIC_MODE,
        ),
        (TLS_SERVER_KEY, tls_key.serialize_pem(), PRIVATE_MODE),
        (
            TLS_SERVER_CERT,
            pem_encode("CERTIFICATE", tls_cert.der()),
            PUBLIC_MODE,
        ),
        // Last, so that a crash mid-init leaves no loadable half bundle.
        (TRUST_DOMAIN_FILE, format!("{trust_domain}\n"), PUBLIC_MODE),
    ];
    for (name, text, mode) in files {
        let p = dir.join(name);
        fsutil::write_atomic(&p, text.as_bytes(), mode).map_err(|e| io_err(&p, e))?;
    }
    // Prove the bundle loads before telling the operator it is done.
    Bundle::load(dir).map(|_| ())
}

/// Reads `DIR/challenge.key`, creating it first when DIR predates it. Safe
/// against a concurrent creator (another replica, a CLI command): the key is
/// written to a private temporary file and hard-linked into place, so the
/// first link wins and everyone reads that one.
pub fn load_or_create_challenge_key(dir: &Path) -> Result<[u8; CHALLENGE_KEY_LEN], PkiError> {
    let path = dir.join(CHALLENGE_KEY);
    match read_capped(&path, CHALLENGE_KEY_LEN as u64) {
        Ok(bytes) => return challenge_key_from(&path, &bytes),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(io_err(&path, e.into())),
    }
    let key: [u8; CHALLENGE_KEY_LEN] =
        crate::ids::random_bytes().map_err(|e| PkiError::Generate {
            what: "the challenge key",
            detail: e.to_string(),
        })?;
    let suffix: [u8; 8] = crate::ids::random_bytes().map_err(|e| PkiError::Generate {
        what: "a temporary file name",
        detail: e.to_string(),
    })?;
    let tmp = dir.join(format!(".{CHALLENGE_KEY}.{}.tmp", hex::encode(suffix)));
    fsutil::write_atomic(&tmp, &key, PRIVATE_MODE).map_err(|e| io_err(&tmp, e))?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
            tracing::info!(path = %path.display(), "created the tpm challenge key");
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let bytes = read(&path)?;
            challenge_key_from(&path, &bytes)
        }
        Err(e) => Err(io_err(&path, e)),
    }
}

fn challenge_key_from(path: &Path, bytes: &[u8]) -> Result<[u8; CHALLENGE_KEY_LEN], PkiError> {
    <[u8; CHALLENGE_KEY_LEN]>::try_from(bytes).map_err(|_| {
        invalid(
            path,
            &format!(
                "expected exactly {CHALLENGE_KEY_LEN} bytes, found {}",
                bytes.len()
            ),
        )
    })
}

fn ca_params(
    cn: &str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<CertificateParams, PkiError> {
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.serial_number = Some(SerialNumber::from_slice(&random_serial()?));
    p.not_before = not_before;
    p.not_after = not_after;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// A `--san`: an IP address, or a DNS name of letters, digits, '-' and '.'.
fn check_san(san: &str) -> Result<(), PkiError> {
    let dns_ok = !san.is_empty()
        && san.len() <= 253
        && san.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if dns_ok || san.parse::<std::net::IpAddr>().is_ok() {
        Ok(())
    } else {
        Err(PkiError::Generate {
            what: "the TLS server certificate",
            detail: format!("{san:?} is neither a host name nor an IP address"),
        })
    }
}

fn tls_server_params(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    extra_sans: &[String],
) -> Result<CertificateParams, PkiError> {
    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    names.extend(
        extra_sans
            .iter()
            .filter(|s| !names.contains(s))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut p =
        CertificateParams::new(names).map_err(|e| gen_err("the TLS server certificate", e))?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, "localhost");
    p.serial_number = Some(SerialNumber::from_slice(&random_serial()?));
    p.not_before = not_before;
    p.not_after = not_after;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    Ok(p)
}

fn load_node_ca(dir: &Path) -> Result<NodeCa, PkiError> {
    let (cert_path, cert_der) = read_pem(dir, NODE_CA_CERT, Kind::Cert)?;
    let (key_path, key_der) = read_pem(dir, NODE_CA_KEY, Kind::Pkcs8)?;
    let key = KeyPair::try_from(key_der.as_slice())
        .map_err(|_| invalid(&key_path, "not a PKCS#8 private key"))?;
    if key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Err(invalid(&key_path, "not a P-256 key"));
    }
    let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
        .map_err(|_| invalid(&cert_path, "not an X.509 certificate"))?;
    let is_ca = matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
    if !is_ca {
        return Err(invalid(&cert_path, "not a CA certificate"));
    }
    if cert.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(invalid(
            &key_path,
            &format!("does not match {NODE_CA_CERT}"),
        ));
    }
    let not_before = cert.validity().not_before.to_datetime();
    let not_after = cert.validity().not_after.to_datetime();
    let issuer = Issuer::from_ca_cert_der(&CertificateDer::from(cert_der.as_slice()), key)
        .map_err(|e| invalid(&cert_path, &e.to_string()))?;
    Ok(NodeCa {
        cert_der,
        issuer,
        not_before,
        not_after,
    })
}

#[derive(Clone, Copy)]
enum Kind {
    Cert,
    Pkcs8,
    Spki,
}

/// Reads a file that must hold exactly one PEM block of the given kind.
fn read_pem(dir: &Path, name: &str, kind: Kind) -> Result<(PathBuf, Vec<u8>), PkiError> {
    use rustls_pemfile::Item;
    let path = dir.join(name);
    let data = read(&path)?;
    let mut items = Vec::new();
    for item in rustls_pemfile::read_all(&mut data.as_slice()) {
        items.push(item.map_err(|e| invalid(&path, &format!("bad PEM: {e}")))?);
    }
    let (want, der) = match (kind, items.as_slice()) {
        (Kind::Cert, [Item::X509Certificate(c)]) => ("", c.to_vec()),
        (Kind::Pkcs8, [Item::Pkcs8Key(k)]) => ("", k.secret_pkcs8_der().to_vec()),
        (Kind::Spki, [Item::SubjectPublicKeyInfo(k)]) => ("", k.to_vec()),
        (Kind::Cert, _) => ("one CERTIFICATE PEM block", Vec::new()),
        (Kind::Pkcs8, _) => ("one PRIVATE KEY (PKCS#8) PEM block", Vec::new()),
        (Kind::Spki, _) => ("one PUBLIC KEY PEM block", Vec::new()),
    };
    if !want.is_empty() {
        return Err(invalid(&path, &format!("expected {want}")));
    }
    Ok((path, der))
}

/// Largest file of the bundle (a certificate chain, a key): none comes near.
const MAX_BUNDLE_FILE: u64 = 1 << 20;

fn read(path: &Path) -> Result<Vec<u8>, PkiError> {
    read_capped(path, MAX_BUNDLE_FILE).map_err(|e| io_err(path, e.into()))
}

/// A file of DIR, read as every operator-named file is (a regular file, a
/// bounded read); links are followed: a bundle may be a mounted secret.
fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, bc_wire::file::FileError> {
    bc_wire::file::read_regular(path, cap, bc_wire::file::Links::Follow)
}

fn generate_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| PkiError::Generate {
        what,
        detail: e.to_string(),
    })
}

/// 16 random bytes, top bit clear (positive) and next bit set (always 16
/// bytes long once encoded).
pub(crate) fn random_serial() -> Result<[u8; 16], PkiError> {
    let mut s: [u8; 16] = crate::ids::random_bytes().map_err(|e| PkiError::Generate {
        what: "a serial number",
        detail: e.to_string(),
    })?;
    s[0] = (s[0] & 0x7f) | 0x40;
    Ok(s)
}

/// PEM with 64-column lines, as every tool writes it.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn io_err(path: &Path, source: std::io::Error) -> PkiError {
    PkiError::Io {
        path: path.to_owned(),
        source,
    }
}

fn invalid(path: &Path, what: &str) -> PkiError {
    PkiError::Invalid {
        path: path.to_owned(),
        what: what.to_owned(),
    }
}

fn gen_err(what: &'static str, e: rcgen::Error) -> PkiError {
    PkiError::Generate {
        what,
        detail: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn init_then_load() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cp");
        init(&dir, "bc.test").unwrap();
        let mode = |n: &str| std::fs::metadata(dir.join(n)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(NODE_CA_KEY), 0o600);
        assert_eq!(mode(JOIN_SIGNING_KEY), 0o600);
        assert_eq!(mode(JOIN_ENCRYPTION_KEY), 0o600);
        assert_eq!(mode(TLS_SERVER_KEY), 0o600);
        assert_eq!(mode(TLS_CA_KEY), 0o600);
        assert_eq!(mode(CHALLENGE_KEY), 0o600);
        let key = load_or_create_challenge_key(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join(CHALLENGE_KEY)).unwrap(), key);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let b = Bundle::load(&dir).unwrap();
        assert_eq!(b.trust_domain, "bc.test");
        // A second init must not replace the keys.
        assert!(matches!(init(&dir, "bc.test"), Err(PkiError::Exists(..))));
    }

    #[test]
    fn load_names_the_broken_file() {
        let tmp = tempfile::tempdir().unwrap();
        init(tmp.path(), "bc.test").unwrap();
        std::fs::write(tmp.path().join(JOIN_SIGNING_PUB), "garbage").unwrap();
        let err = Bundle::load(tmp.path()).err().unwrap().to_string();
        assert!(err.contains(JOIN_SIGNING_PUB), "{err}");
    }

    #[test]
    fn challenge_key_created_lazily_once() {
        let tmp = tempfile::tempdir().unwrap();
        let keys: Vec<_> = (0..8)
            .map(|_| {
                let d = tmp.path().to_owned();
                std::thread::spawn(move || load_or_create_challenge_key(&d).unwrap())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        assert!(keys.iter().all(|k| *k == keys[0]));
        let mode = std::fs::metadata(tmp.path().join(CHALLENGE_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Nothing but the key is left behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        std::fs::write(tmp.path().join(CHALLENGE_KEY), b"short").unwrap();
        let err = load_or_create_challenge_key(tmp.path()).unwrap_err();
        assert!(err.to_string().contains(CHALLENGE_KEY), "{err}");
    }

    /// `init --san`: the TLS certificate names the extra host or address
    /// too (a PXE guest reaches the host as 10.0.2.2); junk is refused
    /// before anything is written.
    #[test]
    fn extra_sans_are_in_the_tls_certificate() {
        use x509_parser::extensions::GeneralName;
        let tmp = tempfile::tempdir().unwrap();
        let junk = init_with_sans(tmp.path(), "bc.test", &["not a host!".to_owned()]);
        assert!(junk.unwrap_err().to_string().contains("not a host!"));
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
        init_with_sans(
            tmp.path(),
            "bc.test",
            &["10.0.2.2".into(), "cp.example".into()],
        )
        .unwrap();
        let b = Bundle::load(tmp.path()).unwrap();
        let (chain, _) = b.tls_server_identity();
        let (_, cert) = x509_parser::parse_x509_certificate(chain[0].as_ref()).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => (*d).to_owned(),
                GeneralName::IPAddress(ip) => format!("{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert!(names.contains(&"cp.example".to_owned()), "{names:?}");
        assert!(names.contains(&"localhost".to_owned()), "{names:?}");
        assert!(names.iter().any(|n| n == "[10, 0, 2, 2]"), "{names:?}");
    }

    #[test]
    fn refuses_bad_trust_domain() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            init(tmp.path(), "Bad Domain"),
            Err(PkiError::TrustDomain(_))
        ));
    }

    #[test]
    fn node_cert_profile() {
        let tmp = tempfile::tempdir().unwrap();
        init(tmp.path(), "bc.test").unwrap();
        let b = Bundle::load(tmp.path()).unwrap();
        let node_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let issued = b
            .node_ca
            .issue(&NodeCertSpec {
                spki_der: &node_key.subject_public_key_info(),
                trust_domain: "bc.test",
                node_id: "node_abc",
                statements: &[],
                not_before: now,
                not_after: now + Duration::hours(48),
            })
            .unwrap();
        assert_eq!(issued.serial_hex.len(), 32);
        let (_, cert) = x509_parser::parse_x509_certificate(&issued.der).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(b.node_ca.cert_der()).unwrap();
        cert.verify_signature(Some(ca.public_key())).unwrap();
        assert_eq!(
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp(),
            24 * 3600
        );
        assert_eq!(
            crate::test_support::uri_sans(&issued.der),
            ["spiffe://bc.test/node/node_abc"]
        );
        assert!(cert.key_usage().unwrap().unwrap().critical);
        assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && eku.server_auth);
    }

    /// A certificate whose URI SANs are `uris`, in order (self-signed: the
    /// reader checks the layout, not the issuer).
    fn cert_with_uris(uris: &[&str]) -> Vec<u8> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(rcgen::string::Ia5String::try_from(*u).unwrap()))
            .collect();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    const ID: &str = "spiffe://bc.test/node/node_abc";

    /// The spec's layout, as the control plane issues: one SPIFFE ID URI SAN
    /// first, then only `urn:bc:` statements, at most four URIs in all.
    #[test]
    fn issue_refuses_uri_layouts_other_than_the_spec() {
        let tmp = tempfile::tempdir().unwrap();
        init(tmp.path(), "bc.test").unwrap();
        let b = Bundle::load(tmp.path()).unwrap();
        let node_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let spki = node_key.subject_public_key_info();
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let issue = |statements: &[&str]| {
            let statements: Vec<String> = statements.iter().map(|s| (*s).to_owned()).collect();
            b.node_ca.issue(&NodeCertSpec {
                spki_der: &spki,
                trust_domain: "bc.test",
                node_id: "node_abc",
                statements: &statements,
                not_before: now,
                not_after: now + Duration::hours(1),
            })
        };
        let three = ["urn:bc:a:1", "urn:bc:b:2", "urn:bc:c:3"];
        let issued = issue(&three).unwrap();
        // The SPIFFE ID first, then the statements in order: the reader
        // takes it back as the issuer wrote it.
        assert_eq!(
            crate::test_support::uri_sans(&issued.der),
            [ID, three[0], three[1], three[2]]
        );
        let back = node_cert_identity(&issued.der).unwrap();
        assert_eq!(
            (back.node_id.as_str(), back.statements.len()),
            ("node_abc", 3)
        );

        let refused = "statements must be at most three urn:bc: URIs";
        for bad in [
            // Five URIs in all.
            &["urn:bc:a:1", "urn:bc:b:2", "urn:bc:c:3", "urn:bc:d:4"][..],
            // A second identity after the first.
            &["spiffe://bc.test/node/node_other"][..],
            // Not a statement.
            &["urn:bc:a:1", "https://bc.test/x"][..],
            &["urn:bcx:a"][..],
        ] {
            match issue(bad) {
                Err(PkiError::Issue(e)) => assert_eq!(e, refused, "{bad:?}"),
                Err(e) => panic!("{bad:?}: {e}"),
                Ok(_) => panic!("{bad:?} issued"),
            }
        }
    }

    /// The same layout as the control plane reads a certificate (renewal,
    /// x509pop, the site's calls): anything else is [`NodeCertError::Uris`].
    #[test]
    fn reading_refuses_uri_layouts_other_than_the_spec() {
        let ok = cert_with_uris(&[ID, "urn:bc:a:1", "urn:bc:b:2", "urn:bc:c:3"]);
        let id = node_cert_identity(&ok).unwrap();
        assert_eq!(id.node_id, "node_abc");
        assert_eq!(id.statements, ["urn:bc:a:1", "urn:bc:b:2", "urn:bc:c:3"]);
        assert!(node_cert_identity(&cert_with_uris(&[ID])).is_ok());

        for bad in [
            // More than three statements.
            &[ID, "urn:bc:a:1", "urn:bc:b:2", "urn:bc:c:3", "urn:bc:d:4"][..],
            // A statement first, the SPIFFE ID after it.
            &["urn:bc:a:1", ID][..],
            // A URI that is not urn:bc: after the SPIFFE ID.
            &[ID, "https://bc.test/x"][..],
            &[ID, "spiffe://bc.test/node/node_other"][..],
            &[ID, "urn:bcx:a"][..],
            // No SPIFFE ID at all, or none first.
            &["urn:bc:a:1"][..],
            &["https://bc.test/node/node_abc", ID][..],
            &[][..],
        ] {
            assert_eq!(
                node_cert_identity(&cert_with_uris(bad)),
                Err(NodeCertError::Uris),
                "{bad:?}"
            );
        }
    }
}
