//! The channel: its frames and the proof that binds it to the node key.
//!
//! The agent opens [`crate::endpoints::COMMAND_CHANNEL`] over mTLS with its
//! node certificate. mTLS alone binds the channel only as far as TLS goes;
//! behind a proxy that terminates TLS it binds nothing, so the first frames
//! prove the node key again: the server sends a [`ChannelHello`] with a
//! fresh nonce, and the agent answers a [`ChannelProof`], its node key's
//! signature (purpose `command-channel`) over that nonce, its node id and
//! its clock. Until the proof verifies, the connection is nobody's channel
//! and holds no slot.

use prost::Message;

use crate::command_v1::{
    agent_frame, server_frame, AgentFrame, ChannelHello, ChannelProof, ServerFrame,
};
use crate::signing::{self, Purpose};

use super::args::printable;
use super::caps::{MAX_COMMAND, MAX_RESULT};

/// The server's nonce: fresh random bytes per connection.
pub const NONCE_LEN: usize = 32;
/// How far the proof's time may be from the server's (database) time.
pub const PROOF_WINDOW_MS: i64 = 60_000;
/// How long the server waits for the proof before it closes the
/// connection: an upgrade that has not proven itself holds no slot long.
pub const PROOF_TIMEOUT_MS: i64 = 10_000;
/// The largest server frame: a command at its cap and the frame around it.
pub const MAX_SERVER_FRAME: usize = MAX_COMMAND + 1024;
/// The largest agent frame: a result at its cap and the frame around it.
pub const MAX_AGENT_FRAME: usize = MAX_RESULT + 1024;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProofError {
    #[error("the channel proof does not parse: {0}")]
    Malformed(&'static str),
    #[error("the channel proof is for another nonce")]
    OtherNonce,
    #[error("the channel proof is for node {0:?}, not the certificate's")]
    OtherNode(String),
    #[error("the channel proof's time {client_ms} is more than {PROOF_WINDOW_MS} ms from the server's {server_ms}")]
    Clock { client_ms: u64, server_ms: i64 },
    #[error("the channel proof is not signed by the node key")]
    Forged,
}

impl ProofError {
    /// The refusal's name, as logs and events say it.
    pub fn reason(&self) -> &'static str {
        match self {
            ProofError::Malformed(_) => "malformed",
            ProofError::OtherNonce => "other-nonce",
            ProofError::OtherNode(_) => "other-node",
            ProofError::Clock { .. } => "clock",
            ProofError::Forged => "forged",
        }
    }
}

/// Calls `f` with the proof's signed fields, in order: the one list both
/// [`sign_proof`] and [`verify_proof`] use.
fn with_fields<T>(
    nonce: &[u8],
    node_id: &str,
    client_time_ms: u64,
    f: impl FnOnce(&[&[u8]]) -> T,
) -> T {
    f(&[nonce, node_id.as_bytes(), &client_time_ms.to_be_bytes()])
}

/// The bytes the node key signs for a proof.
pub fn proof_input(nonce: &[u8], node_id: &str, client_time_ms: u64) -> Vec<u8> {
    with_fields(nonce, node_id, client_time_ms, |f| {
        signing::signing_input(Purpose::CommandChannel, f)
    })
}

/// The agent's answer to a hello, signed with the node key's `sign`.
pub fn sign_proof<E>(
    hello: &ChannelHello,
    node_id: &str,
    client_time_ms: u64,
    key_id: String,
    sign: impl FnOnce(&[u8]) -> Result<[u8; 64], E>,
) -> Result<ChannelProof, E> {
    let signature = sign(&proof_input(&hello.nonce, node_id, client_time_ms))?;
    Ok(ChannelProof {
        node_id: node_id.to_owned(),
        nonce: hello.nonce.clone(),
        client_time_unix_ms: client_time_ms,
        signature: signing::low_s(signature).to_vec(),
        key_id,
    })
}

/// What the server checks a proof against.
pub struct ProofExpect<'a> {
    /// The nonce it sent on this connection.
    pub nonce: &'a [u8; NONCE_LEN],
    /// The node its certificate names.
    pub node_id: &'a str,
    /// That certificate's key (DER SubjectPublicKeyInfo).
    pub node_spki: &'a [u8],
    /// The server's (database) time, Unix ms.
    pub now_ms: i64,
}

/// The server's check of a proof: its nonce, its node, a time within
/// [`PROOF_WINDOW_MS`], and the node key's signature.
pub fn verify_proof(proof: &ChannelProof, expect: &ProofExpect<'_>) -> Result<(), ProofError> {
    if proof.nonce.len() != NONCE_LEN {
        return Err(ProofError::Malformed("the nonce is not 32 bytes"));
    }
    if proof.nonce[..] != expect.nonce[..] {
        return Err(ProofError::OtherNonce);
    }
    if proof.node_id != expect.node_id {
        return Err(ProofError::OtherNode(printable(&proof.node_id)));
    }
    let client = i128::from(proof.client_time_unix_ms);
    if (client - i128::from(expect.now_ms)).abs() > i128::from(PROOF_WINDOW_MS) {
        return Err(ProofError::Clock {
            client_ms: proof.client_time_unix_ms,
            server_ms: expect.now_ms,
        });
    }
    let key = signing::verifying_key_from_spki(expect.node_spki).map_err(|_| ProofError::Forged)?;
    with_fields(
        &proof.nonce,
        &proof.node_id,
        proof.client_time_unix_ms,
        |f| signing::verify(&key, Purpose::CommandChannel, f, &proof.signature),
    )
    .map_err(|_| ProofError::Forged)
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("the frame is {got} bytes, at most {max}")]
    TooLarge { got: usize, max: usize },
    #[error("the frame does not parse")]
    Malformed,
    #[error("the frame carries nothing")]
    Empty,
}

/// Parses a frame from the server (the agent's side; a fuzz entry point).
pub fn parse_server_frame(bytes: &[u8]) -> Result<server_frame::Frame, FrameError> {
    bounded(bytes, MAX_SERVER_FRAME)?;
    ServerFrame::decode(bytes)
        .map_err(|_| FrameError::Malformed)?
        .frame
        .ok_or(FrameError::Empty)
}

/// Parses a frame from an agent (the server's side; a fuzz entry point).
pub fn parse_agent_frame(bytes: &[u8]) -> Result<agent_frame::Frame, FrameError> {
    bounded(bytes, MAX_AGENT_FRAME)?;
    AgentFrame::decode(bytes)
        .map_err(|_| FrameError::Malformed)?
        .frame
        .ok_or(FrameError::Empty)
}

fn bounded(bytes: &[u8], max: usize) -> Result<(), FrameError> {
    if bytes.len() > max {
        return Err(FrameError::TooLarge {
            got: bytes.len(),
            max,
        });
    }
    Ok(())
}

/// The bytes of a server frame (one binary WebSocket message).
pub fn encode_server_frame(frame: server_frame::Frame) -> Vec<u8> {
    ServerFrame { frame: Some(frame) }.encode_to_vec()
}

/// The bytes of an agent frame (one binary WebSocket message).
pub fn encode_agent_frame(frame: agent_frame::Frame) -> Vec<u8> {
    AgentFrame { frame: Some(frame) }.encode_to_vec()
}
