//! The command channel's contract, without I/O: what a command, a result
//! and the channel proof are, the bytes each signature covers, the kinds
//! and who may run them, and every check either side makes.
//!
//! The agent and the control plane both call these functions, so the two
//! sides cannot disagree on what is allowed. The flow:
//!
//! - the control plane [`check`]s a command against the node's certificate
//!   [`Scope`] before it queues it, and [`sign`]s it (purpose `command`,
//!   the JoinService signing key the agent pins);
//! - the agent [`verify`]s it ([`Refused`] otherwise, with a typed reason),
//!   has its journal [`VerifiedCommand::accept`] it (once per id), runs the
//!   [`RunnableCommand`], and [`sign_result`]s what happened (purpose
//!   `command-result`, the node key);
//! - the control plane [`verify_result`]s it before it stores it.
//!
//! The channel itself is bound to the node key by [`channel::sign_proof`] /
//! [`channel::verify_proof`] (purpose `command-channel`). See
//! `docs/commands.md`.

pub mod args;
mod caps;
pub mod channel;
pub mod kinds;
pub mod result;
pub mod scope;
pub mod signed;

pub use caps::MAX_RUNNING;
pub use kinds::{lookup, KindSpec, DISCOVERY_ALLOWED_KINDS, KINDS};
pub use result::{
    new_result, parse_result, sign_result, verify_result, Output, ResultError, Times, MAX_OUTPUT,
};
pub use scope::{KindPattern, Scope, ScopeError};
pub use signed::{
    check, is_command_id, new_command, parse, sign, verify, AcceptError, CommandRefusal, Expect,
    Journal, Refused, RunnableCommand, SignError, VerifiedCommand, MAX_COMMAND,
    MAX_COMMAND_LIFETIME_MS,
};

#[cfg(test)]
mod tests;
