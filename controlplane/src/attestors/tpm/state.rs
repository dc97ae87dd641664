//! The challenge state: what round 2 needs from round 1, carried by the
//! agent instead of a database row.
//!
//! Round 1 writes nothing, so that any replica can finish a join another
//! one started. The state is sealed with AES-256-GCM under `challengeKey`
//! (`DIR/challenge.key`) with the SHA-256 of the CSR as associated data: it
//! opens only for the same CSR, and the agent can neither read the secret in
//! it nor change the AK, the EK or the deadline.
//!
//! Sealed layout: `version (1) ‖ nonce (12) ‖ AES-256-GCM(plaintext) ‖ tag (16)`.
//! Plaintext: `version (1) ‖ ek_spki_sha256 (32) ‖ secret (32) ‖
//! not_after (i64 BE) ‖ u16 len ‖ ak_public ‖ u16 len ‖ ek_issuer ‖ u16 len ‖
//! ek_serial ‖ u16 len ‖ ek_assurance`, and for an EK whose certificate is
//! still to be fetched from its maker's service ([`PendingCertificate`])
//! `‖ u16 len ‖ ek_public ‖ u16 4 ‖ manufacturer (u32 BE) ‖ (u16 len ‖
//! intermediate)*`. A state without that tail is the layout of before it.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use crate::store::UnixMs;

const VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// No legitimate state is larger: refuse bigger input before decrypting
/// (one carrying a pending certificate's intermediates is the largest).
pub(crate) const MAX_STATE_LEN: usize = 4096 + MAX_PENDING_INTERMEDIATES_LEN;
/// The most bytes of intermediates a state carries for a certificate still
/// to be fetched: more are refused in round 1 (`ek-chain`, as more than
/// [`bc_wire::ekcert::MAX_AGENT_INTERMEDIATES`] are).
pub(crate) const MAX_PENDING_INTERMEDIATES_LEN: usize = 16 * 1024;
/// Longest EK issuer name kept in a state (and in a join request).
pub(crate) const MAX_ISSUER_LEN: usize = 512;

/// The AES-256-GCM key that seals challenge states. Never printed.
#[derive(Clone)]
pub(crate) struct ChallengeKey([u8; 32]);

impl ChallengeKey {
    pub(crate) fn new(bytes: [u8; 32]) -> Self {
        ChallengeKey(bytes)
    }
}

impl std::fmt::Debug for ChallengeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChallengeKey(..)")
    }
}

/// What round 1 established, for round 2.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ChallengeState {
    /// SHA-256 of the EK certificate's SubjectPublicKeyInfo DER: the key the
    /// machine joins by.
    pub(crate) ek_spki_sha256: [u8; 32],
    /// The EK certificate's issuer and serial, for a join request.
    pub ek_issuer: String,
    pub ek_serial: String,
    /// The AK's TPMT_PUBLIC, whose name the credential was bound to.
    pub ak_public: Vec<u8>,
    /// The credential MakeCredential encrypted to the EK.
    pub secret: [u8; 32],
    /// Answers after this database time are refused.
    pub not_after: UnixMs,
    /// Where the EK certificate came from ([`crate::model::machine::EkAssurance`]).
    pub ek_assurance: String,
    /// Round 1 challenged the EK before its certificate was known: round 2
    /// fetches and verifies it before anything else.
    pub pending: Option<PendingCertificate>,
}

/// What round 2 needs to fetch and verify the certificate of an EK that
/// round 1 challenged without one: the EK as the agent sent it (the
/// challenge was made for exactly this public area), whose maker it
/// reported, and the intermediates it sent.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PendingCertificate {
    /// TPMT_PUBLIC.
    pub ek_public: Vec<u8>,
    /// TPM_PT_MANUFACTURER.
    pub manufacturer: u32,
    /// DER, untrusted, as in the hello.
    pub intermediates: Vec<Vec<u8>>,
}

impl std::fmt::Debug for ChallengeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChallengeState")
            .field("ek_spki_sha256", &hex::encode(self.ek_spki_sha256))
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum StateError {
    /// Not ours, altered, sealed for another CSR, or under another key.
    #[error("the challenge state does not open")]
    Unopenable,
    #[error("the challenge state cannot be sealed: {0}")]
    Seal(&'static str),
}

impl ChallengeState {
    /// Seals the state for the request whose CSR hashes to `csr_sha256`.
    pub(crate) fn seal(
        &self,
        key: &ChallengeKey,
        csr_sha256: &[u8; 32],
    ) -> Result<Vec<u8>, StateError> {
        let mut plain = Vec::with_capacity(128 + self.ak_public.len());
        plain.push(VERSION);
        plain.extend_from_slice(&self.ek_spki_sha256);
        plain.extend_from_slice(&self.secret);
        plain.extend_from_slice(&self.not_after.to_be_bytes());
        let manufacturer = self.pending.as_ref().map(|p| p.manufacturer.to_be_bytes());
        let mut fields = vec![
            self.ak_public.as_slice(),
            self.ek_issuer.as_bytes(),
            self.ek_serial.as_bytes(),
            self.ek_assurance.as_bytes(),
        ];
        if let (Some(p), Some(m)) = (&self.pending, &manufacturer) {
            fields.push(&p.ek_public);
            fields.push(m);
            fields.extend(p.intermediates.iter().map(Vec::as_slice));
        }
        for field in fields {
            let len =
                u16::try_from(field.len()).map_err(|_| StateError::Seal("a field too long"))?;
            plain.extend_from_slice(&len.to_be_bytes());
            plain.extend_from_slice(field);
        }
        let nonce: [u8; NONCE_LEN] =
            crate::ids::random_bytes().map_err(|_| StateError::Seal("no randomness"))?;
        let cipher = Aes256Gcm::new_from_slice(&key.0).map_err(|_| StateError::Seal("key"))?;
        let sealed = cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: &plain,
                    aad: csr_sha256,
                },
            )
            .map_err(|_| StateError::Seal("encryption failed"))?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        if out.len() > MAX_STATE_LEN {
            return Err(StateError::Seal("the state is too large"));
        }
        Ok(out)
    }

    /// Opens a state sealed by [`ChallengeState::seal`] for the same CSR.
    pub(crate) fn open(
        key: &ChallengeKey,
        sealed: &[u8],
        csr_sha256: &[u8; 32],
    ) -> Result<Self, StateError> {
        if sealed.len() > MAX_STATE_LEN || sealed.len() < 1 + NONCE_LEN + TAG_LEN {
            return Err(StateError::Unopenable);
        }
        let (version, rest) = sealed.split_at(1);
        if version[0] != VERSION {
            return Err(StateError::Unopenable);
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let nonce = <[u8; NONCE_LEN]>::try_from(nonce).map_err(|_| StateError::Unopenable)?;
        let cipher = Aes256Gcm::new_from_slice(&key.0).map_err(|_| StateError::Unopenable)?;
        let plain = cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: csr_sha256,
                },
            )
            .map_err(|_| StateError::Unopenable)?;
        decode(&plain).ok_or(StateError::Unopenable)
    }
}

/// The plaintext; `None` if it is not one this version wrote (it
/// authenticated, so only a key shared with another version gets here).
fn decode(plain: &[u8]) -> Option<ChallengeState> {
    let (&version, rest) = plain.split_first()?;
    if version != VERSION {
        return None;
    }
    let (ek, rest) = split::<32>(rest)?;
    let (secret, rest) = split::<32>(rest)?;
    let (not_after, mut rest) = split::<8>(rest)?;
    let mut fields = Vec::with_capacity(4);
    while !rest.is_empty() {
        let (len, r) = split::<2>(rest)?;
        let len = usize::from(u16::from_be_bytes(len));
        if r.len() < len {
            return None;
        }
        let (field, r) = r.split_at(len);
        fields.push(field.to_vec());
        rest = r;
    }
    // Past the fourth (the EK assurance, absent from states sealed before
    // it): a pending certificate, at least its EK and manufacturer.
    let pending = match fields.len() {
        3 | 4 => None,
        n if n >= 6 => {
            let mut tail = fields.split_off(4).into_iter();
            let ek_public = tail.next()?;
            let manufacturer = u32::from_be_bytes(<[u8; 4]>::try_from(tail.next()?).ok()?);
            Some(PendingCertificate {
                ek_public,
                manufacturer,
                intermediates: tail.collect(),
            })
        }
        _ => return None,
    };
    let ek_assurance = match fields.len() {
        4 => String::from_utf8(fields.pop()?).ok()?,
        _ => "nv".to_owned(),
    };
    let ek_serial = String::from_utf8(fields.pop()?).ok()?;
    let ek_issuer = String::from_utf8(fields.pop()?).ok()?;
    let ak_public = fields.pop()?;
    Some(ChallengeState {
        ek_spki_sha256: ek,
        ek_issuer,
        ek_serial,
        ak_public,
        secret,
        not_after: i64::from_be_bytes(not_after),
        ek_assurance,
        pending,
    })
}

fn split<const N: usize>(b: &[u8]) -> Option<([u8; N], &[u8])> {
    if b.len() < N {
        return None;
    }
    let (head, tail) = b.split_at(N);
    Some((<[u8; N]>::try_from(head).ok()?, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ChallengeState {
        ChallengeState {
            ek_spki_sha256: [1; 32],
            ek_issuer: "CN=BCD Test EK Issuing CA 01".into(),
            ek_serial: "0a1b".into(),
            ak_public: vec![0, 0x23, 0, 0x0b, 9, 9, 9],
            secret: [7; 32],
            not_after: 1_800_000_000_000,
            ek_assurance: "nv".into(),
            pending: None,
        }
    }

    /// A state whose certificate is still to be fetched carries the EK,
    /// its maker and the intermediates, and opens as it was sealed.
    #[test]
    fn carries_a_pending_certificate() {
        let key = ChallengeKey::new([5; 32]);
        let csr = [3; 32];
        for intermediates in [vec![], vec![vec![0x30; 900], vec![0x30, 1]]] {
            let st = ChallengeState {
                ek_assurance: "maker-service".into(),
                ek_issuer: String::new(),
                ek_serial: String::new(),
                pending: Some(PendingCertificate {
                    ek_public: vec![0, 1, 0, 0x0b, 7, 7],
                    manufacturer: u32::from_be_bytes(*b"INTC"),
                    intermediates,
                }),
                ..state()
            };
            let sealed = st.seal(&key, &csr).unwrap();
            assert!(ChallengeState::open(&key, &sealed, &csr).unwrap() == st);
        }
        // The layout without a pending certificate is the one of before.
        assert_eq!(
            decode(&plain_of(&state())).map(|s| s.pending.is_none()),
            Some(true)
        );
    }

    /// The plaintext of `st`, as `seal` encrypts it.
    fn plain_of(st: &ChallengeState) -> Vec<u8> {
        let mut plain = vec![VERSION];
        plain.extend_from_slice(&st.ek_spki_sha256);
        plain.extend_from_slice(&st.secret);
        plain.extend_from_slice(&st.not_after.to_be_bytes());
        for f in [
            st.ak_public.as_slice(),
            st.ek_issuer.as_bytes(),
            st.ek_serial.as_bytes(),
        ] {
            plain.extend_from_slice(&(f.len() as u16).to_be_bytes());
            plain.extend_from_slice(f);
        }
        plain
    }

    #[test]
    fn seals_and_opens() {
        let key = ChallengeKey::new([5; 32]);
        let csr = [3; 32];
        let sealed = state().seal(&key, &csr).unwrap();
        assert_eq!(ChallengeState::open(&key, &sealed, &csr).unwrap(), state());
        // Sealing twice gives different bytes (fresh nonce).
        assert_ne!(sealed, state().seal(&key, &csr).unwrap());
        // The secret is not visible in the sealed bytes.
        assert!(!sealed.windows(32).any(|w| w == [7; 32]));
    }

    #[test]
    fn refuses_other_csr_key_or_alteration() {
        let key = ChallengeKey::new([5; 32]);
        let csr = [3; 32];
        let sealed = state().seal(&key, &csr).unwrap();
        let other_csr = [4; 32];
        assert_eq!(
            ChallengeState::open(&key, &sealed, &other_csr),
            Err(StateError::Unopenable)
        );
        assert_eq!(
            ChallengeState::open(&ChallengeKey::new([6; 32]), &sealed, &csr),
            Err(StateError::Unopenable)
        );
        for i in 0..sealed.len() {
            let mut bent = sealed.clone();
            bent[i] ^= 0x01;
            assert_eq!(
                ChallengeState::open(&key, &bent, &csr),
                Err(StateError::Unopenable),
                "byte {i}"
            );
        }
        for bad in [
            &[][..],
            &[1][..],
            &sealed[..sealed.len() - 1],
            &[0u8; 5000][..],
        ] {
            assert_eq!(
                ChallengeState::open(&key, bad, &csr),
                Err(StateError::Unopenable)
            );
        }
    }

    #[test]
    fn debug_hides_the_secret() {
        let text = format!("{:?} {:?}", state(), ChallengeKey::new([5; 32]));
        assert!(!text.contains("7, 7"), "{text}");
        assert!(!text.contains("5, 5"), "{text}");
    }
}
