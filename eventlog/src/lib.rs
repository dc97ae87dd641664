//! TCG PC Client event logs, as the control plane judges them: parse
//! ([`parse`]: the SHA-1 and crypto-agile formats, bounded by [`Limits`]),
//! replay every bank and compare with quoted PCRs ([`replay`], [`verify`],
//! firmware defects only by name: [`Quirk`]), and extract what an operator
//! writes policy about ([`extract`] into [`BootFacts`]).
//!
//! Protocol logic only: bytes in, values out. No file, socket or
//! subprocess, so the control plane, the CLI and the fuzzer share it, and
//! no `tpm2_eventlog` YAML to break on a tools upgrade. Nothing here
//! panics on any input (fuzz target `eventlog`).

mod alg;
mod facts;
mod parse;
mod replay;
mod uefi;

pub use alg::Alg;
pub use facts::{
    extract, Authority, AuthorityEntry, BootApp, BootFacts, FirmwareBlob, Measured, SignatureDb,
    Version, Warning,
};
pub use parse::{parse, Digest, Event, EventLog, Format, Limits, ParseError};
pub use replay::{replay, verify, Bank, Mismatch, PcrValues, Quirk, Replay, Verification, PCRS};
pub use uefi::{
    parse_signature_update, Gpt, Guid, Partition, Signature, EFI_GLOBAL_VARIABLE,
    EFI_IMAGE_SECURITY_DATABASE, SHIM_LOCK,
};
