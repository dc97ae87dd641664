//! The values that name a machine, below every table and attestor that
//! records or compares them: the expect binding a token carries
//! ([`Expect`]) and the product UUID and MAC it holds ([`ProductUuid`],
//! [`Mac`]), an EK's
//! hash as the resolve list and boot entries store it, a
//! hardware key bound to a node ([`Binding`]), and where an EK certificate
//! came from ([`EkAssurance`]). A leaf: it imports nothing of the crate.

use bc_wire::agent::HardwareClaims;

/// Where a tpm join's EK certificate came from, as a level a pool can
/// require (`pools update --min-ek-assurance`). Every level but `pinned`
/// is a maker's certificate verified against the configured roots in
/// exactly the same way; the order ranks how the certificate reached the
/// verifier:
///
/// `pinned` < `operator-file` < `maker-service` < `nv-chain` = `nv`
///
/// * `pinned`: no certificate; an operator pinned the EK's hash (`resolve
///   add --uncertified`). Nothing says the key is a real TPM's.
/// * `operator-file`: `[tpm] ek_certificate`, a file someone with root on
///   the machine put there; what arrives that way (vendor manifests,
///   downloads) is also what most often chains to an anchor added for
///   another reason (an OEM's CA).
/// * `maker-service`: fetched by the control plane itself from the maker's
///   service by the EK's hash (reserved: no fetcher yet).
/// * `nv`, `nv-chain`: the certificate the maker wrote into the TPM
///   (`nv-chain`: with intermediates from the TPM's chain indices, which
///   are untrusted anyway: the path must still end at an anchor, so the
///   two rank equal). NV vs file is the agent's report; a machine that
///   lies gains nothing it could not get with the same certificate in NV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EkAssurance {
    Pinned,
    OperatorFile,
    MakerService,
    NvChain,
    Nv,
}

impl EkAssurance {
    pub(crate) const ALL: [EkAssurance; 5] = [
        EkAssurance::Pinned,
        EkAssurance::OperatorFile,
        EkAssurance::MakerService,
        EkAssurance::NvChain,
        EkAssurance::Nv,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EkAssurance::Pinned => "pinned",
            EkAssurance::OperatorFile => "operator-file",
            EkAssurance::MakerService => "maker-service",
            EkAssurance::NvChain => "nv-chain",
            EkAssurance::Nv => "nv",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        EkAssurance::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The order a pool's minimum compares by (`nv-chain` = `nv`).
    pub(crate) fn rank(self) -> u8 {
        match self {
            EkAssurance::Pinned => 0,
            EkAssurance::OperatorFile => 1,
            EkAssurance::MakerService => 2,
            EkAssurance::NvChain | EkAssurance::Nv => 3,
        }
    }

    /// Whether this level meets a pool's minimum.
    pub(crate) fn meets(self, min: EkAssurance) -> bool {
        self.rank() >= min.rank()
    }
}

/// A hardware key that identifies one machine for good (e.g. its TPM's EK).
/// JoinService binds it to the admitted node (`node_bindings`): a later join
/// proving it reclaims that node, and it never admits another one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// What kind of key, e.g. [`BINDING_TPM_EK`].
    pub kind: String,
    /// The key's identifier within its kind (lowercase hex of a digest).
    pub key: String,
}

/// The binding kind of a TPM endorsement key: the key is the SHA-256 of the
/// EK certificate's SubjectPublicKeyInfo DER, in lowercase hex.
pub(crate) const BINDING_TPM_EK: &str = "tpm-ek";

/// The machine a token was minted for (`token create --expect-*`): values
/// normalized to lowercase, `None` when the token does not bind that field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// `8-4-4-4-12` hex, as [`ProductUuid`] holds it.
    pub product_uuid: Option<String>,
    /// `aa:bb:cc:dd:ee:ff`, as [`Mac`] holds it.
    pub mac: Option<String>,
}

/// A claim that does not satisfy an [`Expect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExpectMismatch {
    /// The claimed product UUID is empty or another one.
    ProductUuid,
    /// The expected MAC is not among the claimed ones.
    Mac,
}

impl Expect {
    /// Whether `claims` satisfy this binding. Claims are the agent's word,
    /// so they are compared after the same normalization as the expected
    /// values (case, surrounding space), and a malformed one matches nothing.
    pub(crate) fn check(&self, claims: &HardwareClaims) -> Result<(), ExpectMismatch> {
        if let Some(want) = &self.product_uuid {
            if !ProductUuid::parse(&claims.product_uuid).is_ok_and(|u| u.as_str() == want) {
                return Err(ExpectMismatch::ProductUuid);
            }
        }
        if let Some(want) = &self.mac {
            let found = claims
                .macs
                .iter()
                .any(|m| Mac::parse(m).is_ok_and(|m| m.as_str() == want));
            if !found {
                return Err(ExpectMismatch::Mac);
            }
        }
        Ok(())
    }
}

/// A malformed expect value (operator input).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExpectFormatError {
    #[error("{0:?} is not a product UUID (8-4-4-4-12 hex digits, e.g. 4c4c4544-0042-3510-8052-b4c04f4e4d32)")]
    ProductUuid(String),
    #[error("{0:?} is not a MAC address (six hex pairs separated by ':', e.g. 52:54:00:12:34:56)")]
    Mac(String),
}

/// A product UUID in the one form tokens store and claims are compared in:
/// `8-4-4-4-12` hex digits, lowercase (DMI and vendors print either case).
/// Only [`ProductUuid::parse`] makes one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProductUuid(String);

impl ProductUuid {
    /// Operator or agent input, in any case and with surrounding space.
    pub fn parse(s: &str) -> Result<Self, ExpectFormatError> {
        let t = s.trim();
        let bad = || ExpectFormatError::ProductUuid(printable_input(s));
        let groups: Vec<&str> = t.split('-').collect();
        let lens = [8, 4, 4, 4, 12];
        if groups.len() != lens.len()
            || groups
                .iter()
                .zip(lens)
                .any(|(g, n)| g.len() != n || !g.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad());
        }
        Ok(ProductUuid(t.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A MAC in the one form tokens store and claims are compared in: six hex
/// pairs separated by `:`, lowercase. Only [`Mac::parse`] makes one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mac(String);

impl Mac {
    /// Operator or agent input, in any case and with surrounding space.
    pub fn parse(s: &str) -> Result<Self, ExpectFormatError> {
        let t = s.trim();
        let pairs: Vec<&str> = t.split(':').collect();
        if pairs.len() != 6
            || pairs
                .iter()
                .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(ExpectFormatError::Mac(printable_input(s)));
        }
        Ok(Mac(t.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A malformed `ek_sha256` (operator input).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--ek-sha256 must be 64 hex digits (the ekSha256 of bcd tpm identify), not {0:?}")]
pub(crate) struct EkSha256FormatError(String);

/// An EK's hash (the SHA-256 of its SubjectPublicKeyInfo DER) in the one
/// form the resolve list, boot entries and bindings store and compare it
/// in: 64 lowercase hex digits. Only [`EkSha256::parse`] makes one, so a
/// value of this type is never in another form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct EkSha256(String);

impl EkSha256 {
    /// Operator input, in any case and with surrounding space.
    pub(crate) fn parse(s: &str) -> Result<Self, EkSha256FormatError> {
        let lower = s.trim().to_ascii_lowercase();
        if lower.len() == 64 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(EkSha256(lower))
        } else {
            Err(EkSha256FormatError(s.to_owned()))
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for EkSha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Operator or agent input quoted in an error: bounded, so a huge claim
/// cannot flood a log line.
fn printable_input(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expect_values_are_validated_and_normalized() {
        assert_eq!(
            ProductUuid::parse(" 4C4C4544-0042-3510-8052-B4C04F4E4D32\n")
                .unwrap()
                .as_str(),
            "4c4c4544-0042-3510-8052-b4c04f4e4d32"
        );
        assert_eq!(
            Mac::parse("52:54:00:AB:cd:EF").unwrap().as_str(),
            "52:54:00:ab:cd:ef"
        );
        for bad in [
            "",
            "4c4c4544004235108052b4c04f4e4d32",
            "4c4c4544-0042-3510-8052-b4c04f4e4d3",
            "4c4c4544-0042-3510-8052-b4c04f4e4d32-00",
            "4c4c454-40042-3510-8052-b4c04f4e4d32",
            "gc4c4544-0042-3510-8052-b4c04f4e4d32",
            "+c4c4544-0042-3510-8052-b4c04f4e4d32",
        ] {
            assert!(
                matches!(
                    ProductUuid::parse(bad),
                    Err(ExpectFormatError::ProductUuid(_))
                ),
                "{bad:?}"
            );
        }
        for bad in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "52-54-00-12-34-56",
            "525400123456",
            "52:54:00:12:34:5g",
            "52:54:00:12:34:056",
            "5:54:00:12:34:56",
            "+2:54:00:12:34:56",
        ] {
            assert!(
                matches!(Mac::parse(bad), Err(ExpectFormatError::Mac(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_ek_sha256_parses_to_lowercase_hex_only() {
        let upper = format!(" {}\n", "AB".repeat(32));
        assert_eq!(EkSha256::parse(&upper).unwrap().as_str(), "ab".repeat(32));
        for bad in ["", "ab", &"ab".repeat(33), &"gb".repeat(32)] {
            assert_eq!(
                EkSha256::parse(bad),
                Err(EkSha256FormatError(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn expect_check_compares_normalized_claims() {
        let claims = HardwareClaims {
            macs: vec!["not a mac".into(), "52:54:00:AB:CD:EF".into()],
            product_uuid: "4C4C4544-0042-3510-8052-B4C04F4E4D32".into(),
        };
        assert_eq!(Expect::default().check(&HardwareClaims::default()), Ok(()));
        let both = Expect {
            product_uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".into()),
            mac: Some("52:54:00:ab:cd:ef".into()),
        };
        assert_eq!(both.check(&claims), Ok(()));
        assert_eq!(
            both.check(&HardwareClaims::default()),
            Err(ExpectMismatch::ProductUuid)
        );
        let other_mac = Expect {
            mac: Some("52:54:00:ab:cd:ee".into()),
            ..Expect::default()
        };
        assert_eq!(other_mac.check(&claims), Err(ExpectMismatch::Mac));
    }
}
