//! What evidence answers when the control plane challenges a join (the
//! `tpm` evidence's second round), and its error. The join exchange in
//! [`crate::client::join`] takes any of these as its answerer.
use bc_wire::agent::{JoinChallenge, JoinRequest};

/// Evidence that answers a challenge by filling in the next request.
pub(crate) trait AnswerChallenge {
    fn answer(
        &mut self,
        challenge: &JoinChallenge,
        request: &mut JoinRequest,
    ) -> Result<(), ChallengeError>;
}

/// Why the evidence cannot answer: the join shows it as "cannot answer the
/// challenge: …".
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ChallengeError(pub String);
