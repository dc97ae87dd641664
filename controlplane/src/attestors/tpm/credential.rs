//! TPM2_MakeCredential in software: the control plane has no TPM.
//!
//! Binds a credential to the AK's name and encrypts it to the EK (RSA-2048,
//! L-1 template: nameAlg SHA-256, AES-128-CFB), following TPM 2.0 Part 1
//! §24 (credential protection). Only the TPM that holds that EK, with a
//! loaded object of that name, can release it with ActivateCredential.

use aes::cipher::KeyIvInit;
use hmac::{KeyInit, Mac};
use rsa::pkcs8::DecodePublicKey;
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    #[error("the EK is not an RSA public key")]
    EkKey,
    #[error("the credential must be 1 to 64 bytes")]
    Credential,
    #[error("RSA-OAEP failed")]
    Encrypt,
    #[error("no randomness")]
    Random,
}

/// What ActivateCredential takes: the TPM2B_ID_OBJECT and
/// TPM2B_ENCRYPTED_SECRET bodies, without their u16 size prefixes.
pub struct MadeCredential {
    pub id_object: Vec<u8>,
    pub encrypted_secret: Vec<u8>,
}

/// Makes `credential` activatable only by the TPM holding `ek_spki_der`
/// with an object named `ak_name` loaded.
pub fn make_credential(
    ek_spki_der: &[u8],
    ak_name: &[u8],
    credential: &[u8],
) -> Result<MadeCredential, CredentialError> {
    if credential.is_empty() || credential.len() > 64 {
        return Err(CredentialError::Credential);
    }
    let ek =
        rsa::PublicKey::from_public_key_der(ek_spki_der).map_err(|_| CredentialError::EkKey)?;
    // The seed: at most the EK nameAlg's digest size.
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|_| CredentialError::Random)?;
    let oaep = rsa::Oaep::<Sha256>::new_with_label(&b"IDENTITY\0"[..]);
    let encrypted_secret = ek
        .encrypt(&mut rand_core::UnwrapErr(getrandom::SysRng), oaep, &seed)
        .map_err(|_| CredentialError::Encrypt)?;

    // encIdentity = AES-128-CFB(symKey, IV 0) over TPM2B_DIGEST(credential).
    let sym_key = kdfa(&seed, b"STORAGE", ak_name, &[], 128);
    let mut enc_identity = Vec::with_capacity(2 + credential.len());
    enc_identity.extend_from_slice(&(credential.len() as u16).to_be_bytes());
    enc_identity.extend_from_slice(credential);
    let key: [u8; 16] = sym_key
        .as_slice()
        .try_into()
        .map_err(|_| CredentialError::Encrypt)?;
    cfb_mode::Encryptor::<aes::Aes128>::new(&key.into(), &[0u8; 16].into())
        .encrypt(&mut enc_identity);

    // outerHMAC = HMAC(hmacKey, encIdentity ‖ name).
    let hmac_key = kdfa(&seed, b"INTEGRITY", &[], &[], 256);
    let mut mac = HmacSha256::new_from_slice(&hmac_key).map_err(|_| CredentialError::Encrypt)?;
    mac.update(&enc_identity);
    mac.update(ak_name);
    let outer = mac.finalize().into_bytes();

    let mut id_object = Vec::with_capacity(2 + outer.len() + enc_identity.len());
    id_object.extend_from_slice(&(outer.len() as u16).to_be_bytes());
    id_object.extend_from_slice(&outer);
    id_object.extend_from_slice(&enc_identity);
    Ok(MadeCredential {
        id_object,
        encrypted_secret,
    })
}

/// KDFa with HMAC-SHA256 (TPM 2.0 Part 1 §11.4.10.2).
fn kdfa(key: &[u8], label: &[u8], context_u: &[u8], context_v: &[u8], bits: u32) -> Vec<u8> {
    let bytes = (bits as usize).div_ceil(8);
    let mut out = Vec::with_capacity(bytes + 32);
    let mut counter: u32 = 1;
    while out.len() < bytes {
        // An HMAC takes a key of any length: new_from_slice cannot fail.
        let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
            break;
        };
        mac.update(&counter.to_be_bytes());
        mac.update(label);
        mac.update(&[0]);
        mac.update(context_u);
        mac.update(context_v);
        mac.update(&bits.to_be_bytes());
        out.extend_from_slice(&mac.finalize().into_bytes());
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
        assert_eq!(kdfa(b"k", b"STORAGE", b"u", b"", 128).len(), 16);
        assert_eq!(kdfa(b"k", b"INTEGRITY", b"", b"", 256).len(), 32);
        assert_ne!(
            kdfa(b"k", b"A", b"", b"", 256),
            kdfa(b"k", b"B", b"", b"", 256)
        );
    }
}
