//! Commands: built and signed by the control plane, verified by the agent,
//! then accepted by the agent's journal before anything runs.
//!
//! The steps are types, so none can be skipped: [`verify`] turns the bytes
//! that arrived into a [`VerifiedCommand`] (signed by the pinned key, for
//! this node, not expired, a known kind this certificate allows, with
//! well-shaped arguments), which says what it is but cannot run;
//! [`VerifiedCommand::accept`] records its id in the journal and only the
//! first time yields the [`RunnableCommand`] that a kind's code takes. A
//! replayed command (delivery is at least once) verifies again and stops
//! there.

use p256::ecdsa::VerifyingKey;
use prost::Message;

use crate::command_v1::{Arg, Command, SignedCommand};
use crate::signing::{self, Purpose};

use super::args::{self, printable, ArgError, Args};
use super::kinds::{self, KindSpec};
use super::scope::Scope;

pub use super::caps::MAX_COMMAND;
/// The furthest ahead of the agent's clock a command's `not_after` may be:
/// a command is meant for now, and a bound keeps a captured one from
/// outliving the journal that would know it ran.
pub const MAX_COMMAND_LIFETIME_MS: i64 = 24 * 3_600_000;
/// The longest command id (`cmd_` and lowercase alphanumerics).
pub const MAX_ID: usize = 68;

/// Why a command is not run. Each has a name ([`CommandRefusal::reason`])
/// that logs, events and the `refused` result say.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CommandRefusal {
    #[error("the command is {0} bytes, at most {MAX_COMMAND}")]
    Oversized(usize),
    #[error("the command does not parse: {0}")]
    Malformed(&'static str),
    #[error("the command is not signed by the pinned control plane key")]
    Forged,
    #[error("the command is for node {0:?}")]
    OtherNode(String),
    #[error("the command expired at {not_after_ms} (now {now_ms})")]
    Expired { not_after_ms: i64, now_ms: i64 },
    #[error("the command's not_after {not_after_ms} is more than {MAX_COMMAND_LIFETIME_MS} ms after now ({now_ms})")]
    Lifetime { not_after_ms: i64, now_ms: i64 },
    #[error("unknown command kind {0:?}")]
    UnknownKind(String),
    #[error("this node's certificate does not allow kind {0}")]
    KindNotAllowed(&'static str),
    #[error("bad arguments: {0}")]
    BadArgs(#[from] ArgError),
}

impl CommandRefusal {
    /// The refusal's name, as logs, events and results spell it.
    pub fn reason(&self) -> &'static str {
        match self {
            CommandRefusal::Oversized(_) => "oversized",
            CommandRefusal::Malformed(_) => "malformed",
            CommandRefusal::Forged => "forged",
            CommandRefusal::OtherNode(_) => "other-node",
            CommandRefusal::Expired { .. } => "expired",
            CommandRefusal::Lifetime { .. } => "lifetime",
            CommandRefusal::UnknownKind(_) => "unknown-kind",
            CommandRefusal::KindNotAllowed(_) => "kind-not-allowed",
            CommandRefusal::BadArgs(_) => "bad-args",
        }
    }
}

/// A refused command, with the id and kind it claimed when they were
/// readable: what the agent logs and reports. They are claims, not facts
/// (a forged command claims what it likes), so a result naming them says
/// only that a command claiming them was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("command {} refused ({}): {refusal}", .claimed_id.as_deref().unwrap_or("?"), .refusal.reason())]
pub struct Refused {
    pub refusal: CommandRefusal,
    pub claimed_id: Option<String>,
    pub claimed_kind: Option<String>,
}

/// What the agent checks a command against.
pub struct Expect<'a> {
    /// The control plane's signing key, as the agent pins it.
    pub signing_key: &'a VerifyingKey,
    /// This node's id.
    pub node_id: &'a str,
    /// This node's certificate's scope.
    pub scope: &'a Scope,
    /// The agent's clock (Unix ms).
    pub now_ms: i64,
}

/// A command that passed every check but the journal's.
#[derive(Debug, PartialEq)]
pub struct VerifiedCommand {
    command: Command,
    kind: &'static KindSpec,
    args: Args,
    /// The signed bytes, for the journal.
    signed: SignedCommand,
}

/// A command the journal saw for the first time: the one thing a kind's
/// code runs. Only [`VerifiedCommand::accept`] makes one (its fields are
/// private), so no path runs a command the journal did not record.
#[derive(Debug, PartialEq, Eq)]
pub struct RunnableCommand {
    id: String,
    node_id: String,
    kind: &'static KindSpec,
    args: Args,
    not_after_ms: i64,
}

impl RunnableCommand {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn kind(&self) -> &'static KindSpec {
        self.kind
    }

    pub fn args(&self) -> &Args {
        &self.args
    }

    pub fn not_after_ms(&self) -> i64 {
        self.not_after_ms
    }
}

/// The agent's record of the commands it has seen (`journal.db`).
pub trait Journal {
    type Error;
    /// Records `id` atomically and durably, answering `true` the first time
    /// it is seen and `false` ever after. An id must be kept at least until
    /// `not_after_ms` has passed: after that [`verify`] refuses the command
    /// as expired, so the journal may forget it.
    fn first_sight(
        &mut self,
        id: &str,
        not_after_ms: i64,
        signed: &SignedCommand,
    ) -> Result<bool, Self::Error>;
}

/// Why an accepted command does not run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AcceptError<E> {
    #[error("command {0} was seen before (replayed); it runs at most once")]
    Replayed(String),
    #[error("the journal failed: {0}")]
    Journal(E),
}

impl<E> AcceptError<E> {
    /// The name of the refusal, as logs, events and results say it.
    pub fn reason(&self) -> &'static str {
        match self {
            AcceptError::Replayed(_) => "replayed",
            AcceptError::Journal(_) => "journal",
        }
    }
}

impl VerifiedCommand {
    pub fn id(&self) -> &str {
        &self.command.id
    }

    pub fn kind(&self) -> &'static KindSpec {
        self.kind
    }

    pub fn not_after_ms(&self) -> i64 {
        self.command.not_after_unix_ms
    }

    /// Records the command in the journal; only its first sight runs.
    pub fn accept<J: Journal>(
        self,
        journal: &mut J,
    ) -> Result<RunnableCommand, AcceptError<J::Error>> {
        let first = journal
            .first_sight(
                &self.command.id,
                self.command.not_after_unix_ms,
                &self.signed,
            )
            .map_err(AcceptError::Journal)?;
        if !first {
            return Err(AcceptError::Replayed(self.command.id));
        }
        Ok(RunnableCommand {
            id: self.command.id,
            node_id: self.command.node_id,
            kind: self.kind,
            args: self.args,
            not_after_ms: self.command.not_after_unix_ms,
        })
    }
}

/// Builds a command with its arguments in their one order (sorted by
/// name). Checking it is [`check`]'s job.
pub fn new_command(
    id: &str,
    node_id: &str,
    kind: &str,
    args: impl IntoIterator<Item = (String, String)>,
    not_after_ms: i64,
) -> Command {
    let mut args: Vec<Arg> = args
        .into_iter()
        .map(|(name, value)| Arg { name, value })
        .collect();
    args.sort_by(|a, b| a.name.cmp(&b.name));
    Command {
        id: id.to_owned(),
        node_id: node_id.to_owned(),
        kind: kind.to_owned(),
        args,
        not_after_unix_ms: not_after_ms,
    }
}

/// What both sides check of an (authentic) command for a node of `scope`:
/// its id, a known kind the scope allows, its arguments. The control plane
/// runs it before it queues a command (refusing to queue what the node may
/// not run), the agent in [`verify`].
pub fn check(
    command: &Command,
    scope: &Scope,
) -> Result<(&'static KindSpec, Args), CommandRefusal> {
    if !is_command_id(&command.id) {
        return Err(CommandRefusal::Malformed(
            "the id is not cmd_ and lowercase alphanumerics",
        ));
    }
    let kind = kinds::lookup(&command.kind)
        .ok_or_else(|| CommandRefusal::UnknownKind(printable(&command.kind)))?;
    if !scope.allows(kind) {
        return Err(CommandRefusal::KindNotAllowed(kind.name));
    }
    let args = args::check(kind.args, &command.args)?;
    Ok((kind, args))
}

/// Why the control plane could not sign a command.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError<E> {
    #[error("the signed command would be {0} bytes, at most {MAX_COMMAND}")]
    Oversized(usize),
    #[error("the signer failed: {0}")]
    Signer(E),
}

/// Serializes and signs a command (purpose `command`) with `sign`, ES256
/// over the bytes it is given. A command no agent would take (over
/// [`MAX_COMMAND`] once signed) is not signed.
pub fn sign<E>(
    command: &Command,
    key_id: String,
    sign: impl FnOnce(&[u8]) -> Result<[u8; 64], E>,
) -> Result<SignedCommand, SignError<E>> {
    let mut signed = SignedCommand {
        command: command.encode_to_vec(),
        signature: vec![0; 64],
        key_id,
    };
    let len = signed.encoded_len();
    if len > MAX_COMMAND {
        return Err(SignError::Oversized(len));
    }
    let input = signing::signing_input(Purpose::Command, &[&signed.command]);
    signed.signature = sign(&input).map_err(SignError::Signer)?.to_vec();
    Ok(signed)
}

/// Parses a serialized `SignedCommand` (a fuzz entry point): bounded, and
/// the command inside it in its canonical encoding.
pub fn parse(bytes: &[u8]) -> Result<(SignedCommand, Command), CommandRefusal> {
    if bytes.len() > MAX_COMMAND {
        return Err(CommandRefusal::Oversized(bytes.len()));
    }
    let signed = SignedCommand::decode(bytes)
        .map_err(|_| CommandRefusal::Malformed("not a SignedCommand"))?;
    let command = open(&signed)?;
    Ok((signed, command))
}

/// The command inside an envelope, which must be in its canonical encoding
/// (prost drops unknown fields and keeps the last of repeated ones, so any
/// other encoding could carry what one side reads and the other does not).
fn open(signed: &SignedCommand) -> Result<Command, CommandRefusal> {
    let command = Command::decode(signed.command.as_slice())
        .map_err(|_| CommandRefusal::Malformed("not a Command"))?;
    if command.encode_to_vec() != signed.command {
        return Err(CommandRefusal::Malformed(
            "the command is not in its canonical encoding",
        ));
    }
    Ok(command)
}

/// The agent's check of a command that arrived, in this order: size,
/// shape, signature, node, time, kind and scope, arguments. Nothing about
/// a command is trusted before its signature is, but its claimed id and
/// kind are kept for the report.
pub fn verify(signed: &SignedCommand, expect: &Expect<'_>) -> Result<VerifiedCommand, Refused> {
    let mut claimed = (None, None);
    let result = verify_inner(signed, expect, &mut claimed);
    result.map_err(|refusal| Refused {
        refusal,
        claimed_id: claimed.0,
        claimed_kind: claimed.1,
    })
}

fn verify_inner(
    signed: &SignedCommand,
    expect: &Expect<'_>,
    claimed: &mut (Option<String>, Option<String>),
) -> Result<VerifiedCommand, CommandRefusal> {
    let command = Command::decode(signed.command.as_slice()).ok();
    if let Some(c) = &command {
        claimed.0 = is_command_id(&c.id).then(|| c.id.clone());
        claimed.1 = (c.kind.len() <= 64).then(|| printable(&c.kind));
    }
    let len = signed.encoded_len();
    if len > MAX_COMMAND {
        return Err(CommandRefusal::Oversized(len));
    }
    let command = open(signed)?;
    signing::verify(
        expect.signing_key,
        Purpose::Command,
        &[&signed.command],
        &signed.signature,
    )
    .map_err(|_| CommandRefusal::Forged)?;
    if command.node_id != expect.node_id {
        return Err(CommandRefusal::OtherNode(printable(&command.node_id)));
    }
    let (now_ms, not_after_ms) = (expect.now_ms, command.not_after_unix_ms);
    if now_ms > not_after_ms {
        return Err(CommandRefusal::Expired {
            not_after_ms,
            now_ms,
        });
    }
    if not_after_ms.saturating_sub(now_ms) > MAX_COMMAND_LIFETIME_MS {
        return Err(CommandRefusal::Lifetime {
            not_after_ms,
            now_ms,
        });
    }
    let (kind, args) = check(&command, expect.scope)?;
    Ok(VerifiedCommand {
        command,
        kind,
        args,
        signed: signed.clone(),
    })
}

/// Command ids: `cmd_` then 1–64 of `[a-z0-9]` (the journal's key, safe
/// in a log line and a file name).
pub fn is_command_id(id: &str) -> bool {
    id.strip_prefix("cmd_").is_some_and(|s| {
        !s.is_empty()
            && s.len() <= MAX_ID - 4
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}
