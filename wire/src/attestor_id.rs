//! Which attestor: the ids both sides name, one typed value instead of six
//! strings declared on each side. The spellings are the wire's and the
//! database's (`JoinRequest.attestor`, `join_requests.attestor`, events).

/// A built-in attestor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttestorId {
    /// A sealed join token, no further evidence.
    JoinToken,
    /// The TPM's EK and AK, two rounds, the node key certified by the AK.
    Tpm,
    /// Re-joining as itself with the last certificate and its key.
    X509Pop,
    /// A PXE ramdisk vouched for by its site's boot server.
    Discovery,
    /// An installed system's single-use token from its user data, bound to
    /// its product UUID.
    Provisioned,
    /// A cloud VM's identity document, signed by its cloud; no token.
    CloudIid,
}

impl AttestorId {
    pub(crate) const ALL: [AttestorId; 6] = [
        AttestorId::JoinToken,
        AttestorId::Tpm,
        AttestorId::X509Pop,
        AttestorId::Discovery,
        AttestorId::Provisioned,
        AttestorId::CloudIid,
    ];

    /// The id as the wire and the database spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttestorId::JoinToken => "join-token",
            AttestorId::Tpm => "tpm",
            AttestorId::X509Pop => "x509pop",
            AttestorId::Discovery => "discovery",
            AttestorId::Provisioned => "provisioned",
            AttestorId::CloudIid => "cloud-iid",
        }
    }
}

impl std::fmt::Display for AttestorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no built-in attestor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown attestor {0:?}")]
pub struct UnknownAttestor(String);

impl std::str::FromStr for AttestorId {
    type Err = UnknownAttestor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AttestorId::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAttestor(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::AttestorId;

    #[test]
    fn every_id_parses_back_and_nothing_else_does() {
        for a in AttestorId::ALL {
            assert_eq!(a.as_str().parse::<AttestorId>(), Ok(a));
            assert_eq!(a.to_string(), a.as_str());
        }
        let spellings: Vec<&str> = AttestorId::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            spellings,
            [
                "join-token",
                "tpm",
                "x509pop",
                "discovery",
                "provisioned",
                "cloud-iid"
            ]
        );
        for bad in ["", "TPM", "join_token", "x509-pop", " tpm"] {
            assert!(bad.parse::<AttestorId>().is_err(), "{bad:?}");
        }
    }
}
