//! Command results: what a node did, signed by its node key (purpose
//! `command-result`) and verified by the control plane before it stores it.
//!
//! Output is capped at [`MAX_OUTPUT`]: a result carries the first bytes,
//! the whole output's length (above the carried length: cut there) and the
//! whole output's SHA-256, so a cut is always visible and what was cut
//! still has a digest to compare against.

use prost::Message;
use sha2::Digest;

use crate::command_v1::{CommandResult, SignedCommandResult, Status};
use crate::signing::{self, Purpose};

use super::args::printable;
use super::signed::{is_command_id, CommandRefusal, Refused, RunnableCommand};

pub use super::caps::{MAX_OUTCOME, MAX_OUTPUT, MAX_RESULT};

impl Status {
    /// The status as the CLI, the database and events spell it.
    pub fn name(self) -> &'static str {
        match self {
            Status::Unspecified => "unspecified",
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Refused => "refused",
            Status::Expired => "expired",
        }
    }
}

/// A command's output as it is produced: keeps the first [`MAX_OUTPUT`]
/// bytes and digests all of them, so a kind may stream as much as it has.
#[derive(Clone, Debug, Default)]
pub struct Output {
    kept: Vec<u8>,
    total: u64,
    digest: sha2::Sha256,
}

impl Output {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let room = MAX_OUTPUT.saturating_sub(self.kept.len());
        self.kept
            .extend_from_slice(bytes.get(..room).unwrap_or(bytes));
        self.total = self.total.saturating_add(bytes.len() as u64);
        self.digest.update(bytes);
    }

    /// Whether output was cut.
    pub fn is_cut(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

/// When a command ran (Unix ms, the agent's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Times {
    pub started_ms: i64,
    pub finished_ms: i64,
}

/// Builds a result (the agent, before signing it). The outcome is cut to
/// [`MAX_OUTCOME`] bytes.
pub fn new_result(
    id: &str,
    node_id: &str,
    kind: &str,
    status: Status,
    outcome: &str,
    output: Output,
    times: Times,
) -> CommandResult {
    let Times {
        started_ms,
        finished_ms,
    } = times;
    let mut end = outcome.len().min(MAX_OUTCOME);
    while !outcome.is_char_boundary(end) {
        end -= 1;
    }
    CommandResult {
        id: id.to_owned(),
        node_id: node_id.to_owned(),
        kind: kind.to_owned(),
        status: status.into(),
        outcome: outcome.get(..end).unwrap_or_default().to_owned(),
        output_len: output.total,
        output_sha256: output.digest.finalize().to_vec(),
        output: output.kept,
        started_unix_ms: started_ms,
        finished_unix_ms: finished_ms.max(started_ms),
    }
}

impl RunnableCommand {
    /// The result of running this command.
    pub fn result(
        &self,
        status: Status,
        outcome: &str,
        output: Output,
        times: Times,
    ) -> CommandResult {
        new_result(
            self.id(),
            self.node_id(),
            self.kind().name,
            status,
            outcome,
            output,
            times,
        )
    }
}

impl Refused {
    /// The report of a refusal: `expired` for a command past its
    /// not_after, `refused` with the refusal's name otherwise. `None` when
    /// the command claimed no readable id (nothing to report it under; the
    /// agent logs it).
    pub fn result(&self, node_id: &str, now_ms: i64) -> Option<CommandResult> {
        let id = self.claimed_id.as_deref()?;
        let status = match self.refusal {
            CommandRefusal::Expired { .. } => Status::Expired,
            _ => Status::Refused,
        };
        Some(new_result(
            id,
            node_id,
            self.claimed_kind.as_deref().unwrap_or_default(),
            status,
            &format!("{}: {}", self.refusal.reason(), self.refusal),
            Output::new(),
            Times {
                started_ms: now_ms,
                finished_ms: now_ms,
            },
        ))
    }
}

/// Why a result is not stored.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResultError {
    #[error("the result is {0} bytes, at most {MAX_RESULT}")]
    Oversized(usize),
    #[error("the result does not parse: {0}")]
    Malformed(&'static str),
    #[error("the result is not signed by the node's key")]
    Forged,
    #[error("the result is from node {0:?}")]
    OtherNode(String),
    #[error("the result's output does not match its length or digest: {0}")]
    Output(&'static str),
}

impl ResultError {
    /// The refusal's name, as logs and events say it.
    pub fn reason(&self) -> &'static str {
        match self {
            ResultError::Oversized(_) => "oversized",
            ResultError::Malformed(_) => "malformed",
            ResultError::Forged => "forged",
            ResultError::OtherNode(_) => "other-node",
            ResultError::Output(_) => "output",
        }
    }
}

/// Serializes and signs a result (purpose `command-result`) with the node
/// key's `sign`. The signature is put in its low-S form, as for every
/// node-key signature a TPM may make high-S.
pub fn sign_result<E>(
    result: &CommandResult,
    key_id: String,
    sign: impl FnOnce(&[u8]) -> Result<[u8; 64], E>,
) -> Result<SignedCommandResult, E> {
    let bytes = result.encode_to_vec();
    let signature = sign(&signing::signing_input(Purpose::CommandResult, &[&bytes]))?;
    Ok(SignedCommandResult {
        result: bytes,
        signature: signing::low_s(signature).to_vec(),
        key_id,
    })
}

/// Parses a serialized `SignedCommandResult` and checks the result's shape
/// (a fuzz entry point); trust is [`verify_result`]'s.
pub fn parse_result(bytes: &[u8]) -> Result<(SignedCommandResult, CommandResult), ResultError> {
    if bytes.len() > MAX_RESULT {
        return Err(ResultError::Oversized(bytes.len()));
    }
    let signed = SignedCommandResult::decode(bytes)
        .map_err(|_| ResultError::Malformed("not a SignedCommandResult"))?;
    let result = open(&signed)?;
    Ok((signed, result))
}

/// Verifies a result from the node `node_id` whose certificate certifies
/// `node_spki` (DER SubjectPublicKeyInfo), and returns it.
pub fn verify_result(
    signed: &SignedCommandResult,
    node_spki: &[u8],
    node_id: &str,
) -> Result<CommandResult, ResultError> {
    let len = signed.encoded_len();
    if len > MAX_RESULT {
        return Err(ResultError::Oversized(len));
    }
    let result = open(signed)?;
    let key = signing::verifying_key_from_spki(node_spki).map_err(|_| ResultError::Forged)?;
    signing::verify(
        &key,
        Purpose::CommandResult,
        &[&signed.result],
        &signed.signature,
    )
    .map_err(|_| ResultError::Forged)?;
    if result.node_id != node_id {
        return Err(ResultError::OtherNode(printable(&result.node_id)));
    }
    Ok(result)
}

/// The result inside an envelope: canonical, and its fields in shape.
fn open(signed: &SignedCommandResult) -> Result<CommandResult, ResultError> {
    let result = CommandResult::decode(signed.result.as_slice())
        .map_err(|_| ResultError::Malformed("not a CommandResult"))?;
    if result.encode_to_vec() != signed.result {
        return Err(ResultError::Malformed(
            "the result is not in its canonical encoding",
        ));
    }
    check_shape(&result)?;
    Ok(result)
}

fn check_shape(r: &CommandResult) -> Result<(), ResultError> {
    if !is_command_id(&r.id) {
        return Err(ResultError::Malformed("the id is not a command id"));
    }
    if r.kind.len() > 64 {
        return Err(ResultError::Malformed("the kind is longer than 64 bytes"));
    }
    if !matches!(Status::try_from(r.status), Ok(s) if s != Status::Unspecified) {
        return Err(ResultError::Malformed("no status"));
    }
    if r.outcome.len() > MAX_OUTCOME {
        return Err(ResultError::Malformed("the outcome is longer than 1 KiB"));
    }
    if r.finished_unix_ms < r.started_unix_ms {
        return Err(ResultError::Malformed("it finished before it started"));
    }
    if r.output.len() > MAX_OUTPUT {
        return Err(ResultError::Output("more than 1 MiB of output"));
    }
    if r.output_sha256.len() != 32 {
        return Err(ResultError::Output("the digest is not 32 bytes"));
    }
    let carried = r.output.len() as u64;
    if r.output_len < carried {
        return Err(ResultError::Output("a length below the output carried"));
    }
    if r.output_len > carried && r.output.len() != MAX_OUTPUT {
        return Err(ResultError::Output("cut before the cap"));
    }
    if r.output_len == carried && crate::sha256(&r.output)[..] != r.output_sha256[..] {
        return Err(ResultError::Output("the digest is not the output's"));
    }
    Ok(())
}
