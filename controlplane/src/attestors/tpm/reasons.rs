//! The tpm attestor's refusal reasons: a file of their own so that the EK
//! checks ([`super::ek`], [`super::ek_service`]) refuse with them without
//! importing the attestor.

use bc_wire::tpm::CertificationError;

crate::reason::reasons! {
    /// The tpm attestor's reasons, the EK checks' ([`super::ek::EkError`], the
    /// maker's service) and the node-key certification's
    /// ([`bc_wire::tpm::CertificationError`]) among them; the place is its
    /// attestor id, [`super::TPM`].
    pub(crate) enum TpmReason in "tpm" {
        EvidenceMalformed = "evidence-malformed",
        /// The role is not node or site, or not the one the place admits (a site
        /// named: `site`; none: `node`).
        Role = "tpm-role",
        EkCertificate = "ek-certificate",
        EkChain = "ek-chain",
        EkRoca = "ek-roca",
        EkMismatch = "ek-mismatch",
        EkService = "ek-service",
        AkAttributes = "ak-attributes",
        ChallengeState = "challenge-state",
        ChallengeExpired = "challenge-expired",
        /// The challenge was already answered by an admitted join (a replay).
        ChallengeReused = "challenge-reused",
        ChallengeSecret = "challenge-secret",
        QuoteSignature = "quote-signature",
        QuoteNonce = "quote-nonce",
        QuotePcrs = "quote-pcrs",
        PcrPolicy = "pcr-policy",
        /// The node's pool has a boot policy, and the event log sent with the
        /// quote does not parse (or none was sent).
        EventlogMalformed = "eventlog-malformed",
        /// The log does not replay to the quoted PCRs: which PCR in which bank.
        EventlogReplay = "eventlog-replay",
        /// A PCR the boot policy needs was never extended in a quoted bank (all
        /// zeros or all ones: a forged log could be extended into it).
        EventlogBankEmpty = "eventlog-bank-empty",
        /// The pool's boot policy refused what the log says booted
        /// ([`crate::model::boot_policy::judge`]): Secure Boot state, ...
        BootSecureBoot = "boot-secure-boot",
        /// ... a boot application, ...
        BootApp = "boot-app",
        /// ... the dbx, ...
        BootDbx = "boot-dbx",
        /// ... the kernel command line, ...
        BootCmdline = "boot-cmdline",
        /// ... the firmware version.
        BootFirmware = "boot-firmware",
        NodeKeyMalformed = "node-key-malformed",
        NodeKeySignature = "node-key-signature",
        NodeKeyNonce = "node-key-nonce",
        NodeKeyName = "node-key-name",
        NodeKeyAttributes = "node-key-attributes",
        NodeKeyNotCsr = "node-key-not-csr",
        NodeKeyNotCertified = "node-key-not-certified",
        /// `[tpm] enrollment = false`: an EK neither bound nor resolved is refused
        /// instead of filing a join request.
        UnknownEk = "unknown-ek",
        EnrollmentDenied = "enrollment-denied",
    }
}

super::boot::boot_check_reasons!(TpmReason);

impl TpmReason {
    /// A node key the AK did not certify as the spec asks.
    pub(crate) fn node_key(e: &CertificationError) -> Self {
        match e {
            CertificationError::Malformed(_) => TpmReason::NodeKeyMalformed,
            CertificationError::Signature => TpmReason::NodeKeySignature,
            CertificationError::Nonce => TpmReason::NodeKeyNonce,
            CertificationError::Name => TpmReason::NodeKeyName,
            CertificationError::Attributes => TpmReason::NodeKeyAttributes,
            CertificationError::NotCsr => TpmReason::NodeKeyNotCsr,
        }
    }
}
