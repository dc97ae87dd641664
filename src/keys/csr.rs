//! CSRs signed through a [`NodeKey`].
//!
//! rcgen signs with anything that implements its `SigningKey`; the adapter
//! below makes every holder one, so a TPM or helper key makes its CSR the
//! same way a file key does. rcgen expects X.509's DER-encoded ECDSA
//! signature, while holders produce P1363 `r‖s`, hence the conversion.
use std::cell::RefCell;

use p256::ecdsa::Signature;
use p256::elliptic_curve::sec1::ToSec1Point;
use p256::pkcs8::DecodePublicKey;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, PublicKeyData, SignatureAlgorithm, SigningKey,
};

use super::{KeyError, NodeKey};

/// A PKCS#10 CSR in DER, signed by `key`, subject `CN=bcd`, no extensions:
/// the control plane decides every name in the certificate.
pub fn make_csr(key: &dyn NodeKey) -> Result<Vec<u8>, KeyError> {
    let signer = RcgenSigner::new(key)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "bcd");
    params.distinguished_name = dn;
    match params.serialize_request(&signer) {
        Ok(csr) => Ok(csr.der().to_vec()),
        // rcgen only knows "remote key error"; report the holder's own error.
        Err(e) => Err(signer
            .failure
            .take()
            .unwrap_or(KeyError::Csr(e.to_string()))),
    }
}

struct RcgenSigner<'a> {
    key: &'a dyn NodeKey,
    /// The uncompressed SEC1 point: what rcgen calls the public key's DER.
    point: Vec<u8>,
    failure: RefCell<Option<KeyError>>,
}

impl<'a> RcgenSigner<'a> {
    fn new(key: &'a dyn NodeKey) -> Result<Self, KeyError> {
        let pk = p256::PublicKey::from_public_key_der(key.spki_der())
            .map_err(|_| KeyError::BadPublicKey)?;
        Ok(RcgenSigner {
            key,
            point: pk.to_sec1_point(false).as_bytes().to_vec(),
            failure: RefCell::new(None),
        })
    }
}

impl PublicKeyData for RcgenSigner<'_> {
    fn der_bytes(&self) -> &[u8] {
        &self.point
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl SigningKey for RcgenSigner<'_> {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        let p1363 = self.key.sign(msg).map_err(|e| {
            self.failure.replace(Some(e));
            rcgen::Error::RemoteKeyError
        })?;
        let sig = Signature::from_slice(&p1363).map_err(|_| {
            self.failure.replace(Some(KeyError::Sign));
            rcgen::Error::RemoteKeyError
        })?;
        Ok(sig.to_der().as_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::FileKey;
    use x509_parser::prelude::FromDer;

    #[test]
    fn csr_carries_the_key_and_verifies() {
        let k = FileKey::generate().unwrap();
        let der = make_csr(&k).unwrap();
        let (rest, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&der).unwrap();
        assert!(rest.is_empty());
        assert_eq!(csr.certification_request_info.subject_pki.raw, k.spki_der());
        csr.verify_signature().unwrap();
    }

    #[derive(Debug)]
    struct Broken(Vec<u8>);
    impl NodeKey for Broken {
        fn kind(&self) -> crate::keys::NodeKeyKind {
            crate::keys::NodeKeyKind::Tpm
        }
        fn spki_der(&self) -> &[u8] {
            &self.0
        }
        fn sign(&self, _: &[u8]) -> Result<[u8; 64], KeyError> {
            Err(KeyError::Sign)
        }
        fn to_file_contents(
            &self,
        ) -> Result<p256::elliptic_curve::zeroize::Zeroizing<String>, KeyError> {
            Err(KeyError::Encode)
        }
    }

    #[test]
    fn a_failing_holder_reports_its_own_error() {
        let k = FileKey::generate().unwrap();
        let e = make_csr(&Broken(k.spki_der().to_vec())).unwrap_err();
        assert!(matches!(e, KeyError::Sign), "{e:?}");
    }
}
