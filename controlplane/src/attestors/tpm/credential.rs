//! TPM2_MakeCredential in software: the control plane has no TPM.
//!
//! Binds a credential to the AK's name and encrypts it to the EK, following
//! TPM 2.0 Part 1 §24 (credential protection). Only the TPM that holds that
//! EK, with a loaded object of that name, can release it with
//! ActivateCredential.
//!
//! The seed is protected by the EK's kind of key: RSA-OAEP for an RSA EK,
//! an ephemeral ECDH for an ECC EK ([`super::credential_ecc`]). The rest
//! (symmetric key, HMAC) uses the EK template's nameAlg and symmetric key
//! size ([`EkTemplate`]).

use aes::cipher::KeyIvInit;
use rsa::pkcs8::DecodePublicKey;
use sha2::Sha256;

use super::ek_template::EkTemplate;
pub(crate) use super::ek_template::{CredentialError, NameAlg};

/// What ActivateCredential takes: the TPM2B_ID_OBJECT and
/// TPM2B_ENCRYPTED_SECRET bodies, without their u16 size prefixes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MadeCredential {
    pub id_object: Vec<u8>,
    pub encrypted_secret: Vec<u8>,
}

/// Makes `credential` activatable only by the TPM holding the EK of
/// `template` whose key is `ek_spki_der`, with an object named `ak_name`
/// loaded.
pub(crate) fn make_credential(
    template: EkTemplate,
    ek_spki_der: &[u8],
    ak_name: &[u8],
    credential: &[u8],
) -> Result<MadeCredential, CredentialError> {
    if credential.is_empty() || credential.len() > 64 {
        return Err(CredentialError::Credential);
    }
    let (seed, encrypted_secret) = match template {
        EkTemplate::RsaL1 => rsa_seed(ek_spki_der)?,
        EkTemplate::EccL2P256 | EkTemplate::EccH3P384 => {
            super::credential_ecc::ecc_seed(template, ek_spki_der)?
        }
    };
    let id_object = wrap(template, &seed, ak_name, credential)?;
    Ok(MadeCredential {
        id_object,
        encrypted_secret,
    })
}

/// A 32-byte seed (the nameAlg's digest size) encrypted with RSA-OAEP
/// (SHA-256, label "IDENTITY\0") to the EK.
fn rsa_seed(ek_spki_der: &[u8]) -> Result<(Vec<u8>, Vec<u8>), CredentialError> {
    let ek =
        rsa::PublicKey::from_public_key_der(ek_spki_der).map_err(|_| CredentialError::EkKey)?;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|_| CredentialError::Random)?;
    let oaep = rsa::Oaep::<Sha256>::new_with_label(&b"IDENTITY\0"[..]);
    let encrypted_secret = ek
        .encrypt(&mut rand_core::UnwrapErr(getrandom::SysRng), oaep, &seed)
        .map_err(|_| CredentialError::Encrypt)?;
    Ok((seed.to_vec(), encrypted_secret))
}

/// The TPM2B_ID_OBJECT body for `credential` under `seed`:
/// `u16 ‖ outerHMAC ‖ encIdentity`.
pub(super) fn wrap(
    template: EkTemplate,
    seed: &[u8],
    ak_name: &[u8],
    credential: &[u8],
) -> Result<Vec<u8>, CredentialError> {
    let alg = template.name_alg();
    // encIdentity = AES-CFB(symKey, IV 0) over TPM2B_DIGEST(credential).
    let sym_key = kdfa(alg, seed, b"STORAGE", ak_name, &[], template.sym_key_bits());
    let mut enc_identity = Vec::with_capacity(2 + credential.len());
    enc_identity.extend_from_slice(&(credential.len() as u16).to_be_bytes());
    enc_identity.extend_from_slice(credential);
    let iv = [0u8; 16];
    match sym_key.len() {
        16 => {
            let key: [u8; 16] = sym_key
                .as_slice()
                .try_into()
                .map_err(|_| CredentialError::Encrypt)?;
            cfb_mode::Encryptor::<aes::Aes128>::new(&key.into(), &iv.into())
                .encrypt(&mut enc_identity);
        }
        32 => {
            let key: [u8; 32] = sym_key
                .as_slice()
                .try_into()
                .map_err(|_| CredentialError::Encrypt)?;
            cfb_mode::Encryptor::<aes::Aes256>::new(&key.into(), &iv.into())
                .encrypt(&mut enc_identity);
        }
        _ => return Err(CredentialError::Encrypt),
    }

    // outerHMAC = HMAC(hmacKey, encIdentity ‖ name), hmacKey the digest's size.
    let hmac_key = kdfa(
        alg,
        seed,
        b"INTEGRITY",
        &[],
        &[],
        (alg.digest_len() * 8) as u32,
    );
    let outer = alg.hmac(&hmac_key, &[&enc_identity, ak_name]);

    let mut id_object = Vec::with_capacity(2 + outer.len() + enc_identity.len());
    id_object.extend_from_slice(&(outer.len() as u16).to_be_bytes());
    id_object.extend_from_slice(&outer);
    id_object.extend_from_slice(&enc_identity);
    Ok(id_object)
}

/// KDFa with HMAC-`alg` (TPM 2.0 Part 1 §11.4.10.2).
fn kdfa(
    alg: NameAlg,
    key: &[u8],
    label: &[u8],
    context_u: &[u8],
    context_v: &[u8],
    bits: u32,
) -> Vec<u8> {
    let bytes = (bits as usize).div_ceil(8);
    let mut out = Vec::with_capacity(bytes + alg.digest_len());
    let mut counter: u32 = 1;
    while out.len() < bytes {
        out.extend_from_slice(&alg.hmac(
            key,
            &[
                &counter.to_be_bytes(),
                label,
                &[0],
                context_u,
                context_v,
                &bits.to_be_bytes(),
            ],
        ));
        counter += 1;
    }
    out.truncate(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KDFa yields the asked-for length, and the label changes the output.
    #[test]
    fn kdfa_lengths() {
        let a = NameAlg::Sha256;
        assert_eq!(kdfa(a, b"k", b"STORAGE", b"u", b"", 128).len(), 16);
        assert_eq!(kdfa(a, b"k", b"INTEGRITY", b"", b"", 256).len(), 32);
        assert_eq!(kdfa(NameAlg::Sha384, b"k", b"S", b"", b"", 384).len(), 48);
        assert_ne!(
            kdfa(a, b"k", b"A", b"", b"", 256),
            kdfa(a, b"k", b"B", b"", b"", 256)
        );
    }
}
