//! A loopback HTTPS server's TLS, for tests that stand in for a third
//! party (a maker's EK certificate service, an OIDC issuer): a fresh CA of
//! its own, so the client under test trusts it only when told to, and a
//! leaf for `127.0.0.1` and `localhost`.

use std::sync::Arc;

/// The CA (give it to the client under test) and the server's config.
pub struct LoopbackTls {
    pub ca: rcgen::Certificate,
    pub server: rustls::ServerConfig,
}

/// A CA named `ca_name` and a P-256 leaf it signs for loopback.
pub fn loopback_tls(ca_name: &str) -> LoopbackTls {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("CA key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::from_params(&params, &ca_key);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("leaf key");
    let mut leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("leaf");
    leaf.subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    let leaf = leaf.signed_by(&key, &issuer).expect("leaf certificate");
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .expect("TLS server config");
    LoopbackTls { ca, server }
}
