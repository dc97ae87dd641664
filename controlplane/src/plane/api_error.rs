//! The one error every endpoint answers with: its code, HTTP status and wire
//! form. Refusals are all ACCESS_DENIED with one public message per API, so
//! an agent learns nothing about why it was refused.

use bc_wire::agent;

use crate::store::DbError;

/// What an agent sees when a call fails. Only the code and the public
/// message leave the server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Every join refusal, whatever the reason.
    #[error("join refused")]
    AccessDenied,
    /// Every renewal refusal, whatever the reason: ACCESS_DENIED too, with
    /// the spec's own message ("Renew refused").
    #[error("renew refused")]
    RenewRefused,
    /// A renewal refused by its boot evidence: ACCESS_DENIED, and the node
    /// (which proved who it is) is told the reason and what failed, so
    /// `bcd doctor` can say why it stopped renewing.
    #[error("renew refused: {0}")]
    RenewRefusedBoot(String),
    /// Every refusal of a site call (lease, SecretRequest).
    #[error("site request refused")]
    SiteRefused,
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub(crate) fn code(&self) -> agent::Code {
        match self {
            ApiError::AccessDenied
            | ApiError::RenewRefused
            | ApiError::RenewRefusedBoot(_)
            | ApiError::SiteRefused => agent::Code::AccessDenied,
            ApiError::InvalidInput(_) => agent::Code::InvalidInput,
            ApiError::NotFound(_) => agent::Code::NotFound,
            ApiError::Unavailable(_) => agent::Code::Unavailable,
            ApiError::Internal(_) => agent::Code::Internal,
        }
    }

    pub(crate) fn http_status(&self) -> u16 {
        match self {
            ApiError::AccessDenied
            | ApiError::RenewRefused
            | ApiError::RenewRefusedBoot(_)
            | ApiError::SiteRefused => 403,
            ApiError::InvalidInput(_) => 400,
            ApiError::NotFound(_) => 404,
            ApiError::Unavailable(_) => 503,
            ApiError::Internal(_) => 500,
        }
    }

    /// The message an agent gets: what was wrong with its request, but
    /// nothing about why it was refused or what failed inside the server.
    pub(crate) fn public_message(&self) -> String {
        match self {
            ApiError::AccessDenied => "join refused".to_owned(),
            ApiError::RenewRefused => "Renew refused".to_owned(),
            ApiError::RenewRefusedBoot(why) => {
                format!("{}: {why}", bc_wire::tpm::RENEW_REFUSED_BOOT)
            }
            ApiError::SiteRefused => "site request refused".to_owned(),
            ApiError::InvalidInput(m) | ApiError::NotFound(m) => m.clone(),
            ApiError::Unavailable(_) => {
                "the control plane cannot serve now; retry later".to_owned()
            }
            ApiError::Internal(_) => "internal error".to_owned(),
        }
    }

    pub(crate) fn to_wire(&self) -> agent::Error {
        agent::Error {
            code: self.code() as i32,
            message: self.public_message(),
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            e if e.is_transient() => ApiError::Unavailable(e.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}
