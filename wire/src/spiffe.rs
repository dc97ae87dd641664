//! Node identity URIs: `spiffe://<trust-domain>/node/<node-id>`.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpiffeError {
    #[error("not a node SPIFFE ID (expected spiffe://<trust-domain>/node/<node-id>)")]
    NotNodeId,
    #[error("invalid trust domain {0:?} (lowercase letters, digits, '.', '-' and '_')")]
    TrustDomain(String),
    #[error("invalid node id {0:?} (expected node_ followed by lowercase letters and digits)")]
    NodeId(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpiffeId {
    pub trust_domain: String,
    pub node_id: String,
}

impl NodeSpiffeId {
    pub fn new(trust_domain: &str, node_id: &str) -> Result<Self, SpiffeError> {
        check_trust_domain(trust_domain)?;
        check_node_id(node_id)?;
        Ok(NodeSpiffeId {
            trust_domain: trust_domain.to_owned(),
            node_id: node_id.to_owned(),
        })
    }

    /// Parses exactly `spiffe://<td>/node/<id>`: no port, user info, query,
    /// fragment, trailing slash or further path segment.
    pub fn parse(uri: &str) -> Result<Self, SpiffeError> {
        let rest = uri
            .strip_prefix("spiffe://")
            .ok_or(SpiffeError::NotNodeId)?;
        let (td, path) = rest.split_once('/').ok_or(SpiffeError::NotNodeId)?;
        let id = path.strip_prefix("node/").ok_or(SpiffeError::NotNodeId)?;
        Self::new(td, id)
    }
}

impl fmt::Display for NodeSpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{}/node/{}", self.trust_domain, self.node_id)
    }
}

/// SPIFFE trust domain names: 1–255 of `[a-z0-9._-]`.
pub fn check_trust_domain(td: &str) -> Result<(), SpiffeError> {
    let ok = !td.is_empty()
        && td.len() <= 255
        && td.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        });
    if ok {
        Ok(())
    } else {
        Err(SpiffeError::TrustDomain(td.to_owned()))
    }
}

/// Node ids: `node_` then 1–64 of `[a-z0-9]`.
pub fn check_node_id(id: &str) -> Result<(), SpiffeError> {
    let ok = id.strip_prefix("node_").is_some_and(|s| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    });
    if ok {
        Ok(())
    } else {
        Err(SpiffeError::NodeId(id.to_owned()))
    }
}
