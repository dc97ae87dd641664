//! The discovery attestor's refusal reasons: a file of their own so that
//! [`super::approval`] refuses with them without importing the attestor.

crate::reason::reasons! {
    /// The discovery attestor's reasons (its approval gate's too), after
    /// [`live_token`](crate::attestors::join_token::live_token)'s; the place is
    /// its attestor id, [`super::DISCOVERY`].
    pub(crate) enum DiscoveryReason in "discovery" {
        Role = "discovery-role",
        AssertionMalformed = "assertion-malformed",
        AssertionReused = "assertion-reused",
        TokenRole = "token-role",
        TokenExhausted = "token-exhausted",
        TokenNotSingleUse = "token-not-single-use",
        TokenSite = "token-site",
        TokenMac = "token-mac",
        SignerUnknown = "signer-unknown",
        SignerRetired = "signer-retired",
        SignerNotSite = "signer-not-site",
        LeaseNotHeld = "lease-not-held",
        LeaseEpoch = "lease-epoch",
        SignerCertificate = "signer-certificate",
        AssertionSignature = "assertion-signature",
        AssertionStale = "assertion-stale",
        AssertionFuture = "assertion-future",
        MacNotClaimed = "mac-not-claimed",
        ProductUuidMismatch = "product-uuid-mismatch",
        /// The boot entry expects an EK (`boot add --ek-sha256` / `--node`) and
        /// the join proved none (no TPM evidence).
        BootEkMissing = "boot-ek-missing",
        /// The boot entry expects another EK than the one the join names or proved.
        BootEkMismatch = "boot-ek-mismatch",
        ApprovalDenied = "approval-denied",
        ApprovalBusy = "approval-busy",
    }
}
