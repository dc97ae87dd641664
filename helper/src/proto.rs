//! The helper's protocol: one request, one response, each a frame of a
//! 4-byte big-endian length and a protobuf message.
//!
//! Protobuf (prost, as `wire/` uses) rather than a hand-made layout: its
//! decoder takes arbitrary bytes without panicking, unknown fields are
//! skipped so either side can grow, and the messages are declared here with
//! prost's derives, so no `protoc` run is needed. Frames are bounded
//! ([`MAX_REQUEST`], [`MAX_RESPONSE`]) before a byte of the body is read,
//! and a decoded request is checked into an [`Operation`] (exact key and
//! digest sizes) before the backend sees it.

/// The largest request: a certify carries a 32-byte unique and at most 64
/// bytes of qualifying data, a sign a 64-byte digest; a few hundred bytes
/// is plenty, and anything longer is refused unread.
pub const MAX_REQUEST: usize = 1024;

/// The largest response: a TPMS_ATTEST and a TPMT_SIGNATURE, or an AK's
/// public area and name, are well under 1 KiB each.
pub(crate) const MAX_RESPONSE: usize = 16 * 1024;

/// The largest `system.journal` response: its text (at most
/// [`crate::journal::MAX_BYTES`]) and room for the framing.
pub(crate) const MAX_JOURNAL_RESPONSE: usize = crate::journal::MAX_BYTES as usize + 1024;

/// The largest `eventlog.read` response: the event log (at most
/// [`bc_wire::tpm::MAX_EVENT_LOG`]) and room for the framing.
pub(crate) const MAX_EVENT_LOG_RESPONSE: usize = bc_wire::tpm::MAX_EVENT_LOG + 1024;

/// TPM2B_DATA holds at most a TPMT_HA (a SHA-512 digest and its algorithm).
pub(crate) const MAX_QUALIFYING: usize = 64;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(oneof = "request::Op", tags = "1, 2, 3, 4, 5, 6, 7, 8")]
    pub op: Option<request::Op>,
}

pub(crate) mod request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Op {
        /// `tpm.ak`
        #[prost(message, tag = "1")]
        Ak(super::AkRequest),
        /// `tpm.nodekey`
        #[prost(message, tag = "2")]
        NodeKey(super::NodeKeyRequest),
        /// `tpm.sign`
        #[prost(message, tag = "3")]
        Sign(super::SignRequest),
        /// `tpm.certify`
        #[prost(message, tag = "4")]
        Certify(super::CertifyRequest),
        /// `machine.ids`
        #[prost(message, tag = "5")]
        Machine(super::MachineRequest),
        /// `system.journal`
        #[prost(message, tag = "6")]
        Journal(super::JournalRequest),
        /// `eventlog.read`
        #[prost(message, tag = "7")]
        EventLog(super::EventLogRequest),
        /// `tpm.certify_quote`
        #[prost(message, tag = "8")]
        CertifyQuote(super::CertifyQuoteRequest),
    }
}

/// `system.journal`: a time and two bounds, nothing else (the units are
/// the helper's, [`crate::journal::UNITS`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct JournalRequest {
    /// Unix milliseconds.
    #[prost(uint64, tag = "1")]
    pub since_ms: u64,
    #[prost(uint32, tag = "2")]
    pub lines: u32,
    #[prost(uint32, tag = "3")]
    pub bytes: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct JournalResponse {
    /// The newest whole lines, each ending in a newline.
    #[prost(string, tag = "1")]
    pub text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MachineRequest {}

/// `eventlog.read`: nothing to say; the helper reads the one log there is.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventLogRequest {}

/// The TCG event log (`binary_bios_measurements`) as read, unparsed: the
/// control plane parses it, bounded.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventLogResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub log: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AkRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeKeyRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub unique: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SignRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub unique: Vec<u8>,
    /// [`Hash`] as its TPM algorithm id.
    #[prost(uint32, tag = "2")]
    pub hash: u32,
    #[prost(bytes = "vec", tag = "3")]
    pub digest: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CertifyRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub unique: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub qualifying: Vec<u8>,
}

/// `tpm.certify_quote`: a certification as `tpm.certify`'s, and in the
/// same TPM connection a quote by the AK over `extra` of `pcrs` in every
/// bank the TPM has populated with them (a renewal under a boot policy).
#[derive(Clone, PartialEq, prost::Message)]
pub struct CertifyQuoteRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub unique: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub qualifying: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub extra: Vec<u8>,
    #[prost(uint32, repeated, tag = "4")]
    pub pcrs: Vec<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CertifyQuoteResponse {
    #[prost(message, optional, tag = "1")]
    pub certify: Option<CertifyResponse>,
    /// TPMS_ATTEST of the quote.
    #[prost(bytes = "vec", tag = "2")]
    pub quote: Vec<u8>,
    /// TPMT_SIGNATURE by the AK.
    #[prost(bytes = "vec", tag = "3")]
    pub quote_signature: Vec<u8>,
    /// The quoted PCRs' values, in selection order.
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub pcr_values: Vec<Vec<u8>>,
}

/// The most PCRs a quote asks for (a TPM has 24).
pub(crate) const MAX_QUOTE_PCRS: usize = 24;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(oneof = "response::Result", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9")]
    pub result: Option<response::Result>,
}

pub mod response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Result {
        #[prost(message, tag = "1")]
        Ak(super::AkResponse),
        #[prost(message, tag = "2")]
        NodeKey(super::NodeKeyResponse),
        #[prost(message, tag = "3")]
        Sign(super::SignResponse),
        #[prost(message, tag = "4")]
        Certify(super::CertifyResponse),
        /// The operation failed in the helper (its TPM's error, in words).
        #[prost(message, tag = "5")]
        Error(super::ErrorResponse),
        #[prost(message, tag = "6")]
        Machine(super::MachineResponse),
        #[prost(message, tag = "7")]
        Journal(super::JournalResponse),
        #[prost(message, tag = "8")]
        EventLog(super::EventLogResponse),
        #[prost(message, tag = "9")]
        CertifyQuote(super::CertifyQuoteResponse),
    }
}

/// What only root reads of the machine, for the node's inventory
/// (`inventory.refresh`): DMI's identifiers (root-only files) and the TPM
/// the helper holds.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MachineResponse {
    /// DMI `product_uuid`, lowercase; empty when there is none.
    #[prost(string, tag = "1")]
    pub product_uuid: String,
    /// DMI `product_serial`; empty when there is none.
    #[prost(string, tag = "2")]
    pub product_serial: String,
    /// SHA-256 of the EK's SubjectPublicKeyInfo (its certificate's key
    /// when there is one); empty when the EK cannot be read.
    #[prost(bytes = "vec", tag = "3")]
    pub ek_sha256: Vec<u8>,
    #[prost(string, tag = "4")]
    pub manufacturer: String,
    #[prost(string, tag = "5")]
    pub vendor: String,
    #[prost(string, tag = "6")]
    pub firmware: String,
    /// The allocated PCR banks (`sha1`, `sha256`, …).
    #[prost(string, repeated, tag = "7")]
    pub pcr_banks: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AkResponse {
    /// The AK's TPMT_PUBLIC.
    #[prost(bytes = "vec", tag = "1")]
    pub public: Vec<u8>,
    /// Its TPM name (nameAlg ‖ digest of the public area).
    #[prost(bytes = "vec", tag = "2")]
    pub name: Vec<u8>,
    /// Which TPM the helper holds, in words (maker, firmware), for `bcd doctor`.
    #[prost(string, tag = "3")]
    pub tpm: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeKeyResponse {
    /// The node key's TPMT_PUBLIC.
    #[prost(bytes = "vec", tag = "1")]
    pub public: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SignResponse {
    /// ECDSA P-256, P1363 `r‖s`.
    #[prost(bytes = "vec", tag = "1")]
    pub signature: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CertifyResponse {
    /// TPMS_ATTEST.
    #[prost(bytes = "vec", tag = "1")]
    pub certify_info: Vec<u8>,
    /// TPMT_SIGNATURE by the AK.
    #[prost(bytes = "vec", tag = "2")]
    pub signature: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorResponse {
    #[prost(string, tag = "1")]
    pub message: String,
}

/// The hash a digest to sign was made with; the TPM signs with the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    /// TPM_ALG_ID.
    pub(crate) fn alg_id(self) -> u32 {
        match self {
            Hash::Sha256 => 0x000B,
            Hash::Sha384 => 0x000C,
            Hash::Sha512 => 0x000D,
        }
    }

    pub(crate) fn from_alg_id(id: u32) -> Option<Hash> {
        match id {
            0x000B => Some(Hash::Sha256),
            0x000C => Some(Hash::Sha384),
            0x000D => Some(Hash::Sha512),
            _ => None,
        }
    }

    pub fn digest_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }
}

/// A request, checked: the closed set of things a caller may ask. The
/// caller names a key by its unique and nothing else; the helper picks
/// every template, hierarchy, handle and authorization itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    Ak,
    NodeKey {
        unique: [u8; 32],
    },
    Sign {
        unique: [u8; 32],
        hash: Hash,
        digest: Vec<u8>,
    },
    Certify {
        unique: [u8; 32],
        qualifying: Vec<u8>,
    },
    /// `machine.ids`: what only root reads of the machine (DMI's
    /// identifiers, the TPM's EK and maker), for the node's inventory.
    Machine,
    /// `system.journal`: the system journal of bcd's units, bounded, for
    /// `logs.collect`.
    Journal(crate::journal::Query),
    /// `eventlog.read`: the TCG event log, root-only, for a renewal under a
    /// pool's boot policy; bounded by [`bc_wire::tpm::MAX_EVENT_LOG`].
    EventLog,
    /// `tpm.certify_quote`: `tpm.certify`, and a quote by the AK over
    /// `extra` of `pcrs` (PCR indices below 24) in every populated bank,
    /// in one TPM connection.
    CertifyQuote {
        unique: [u8; 32],
        qualifying: Vec<u8>,
        extra: Vec<u8>,
        pcrs: Vec<u32>,
    },
}

impl Operation {
    /// The operation's name, as logs and errors say it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Operation::Ak => "tpm.ak",
            Operation::NodeKey { .. } => "tpm.nodekey",
            Operation::Sign { .. } => "tpm.sign",
            Operation::Certify { .. } => "tpm.certify",
            Operation::Machine => "machine.ids",
            Operation::Journal(_) => "system.journal",
            Operation::EventLog => "eventlog.read",
            Operation::CertifyQuote { .. } => "tpm.certify_quote",
        }
    }

    /// The largest response this operation can get.
    pub(crate) fn max_response(&self) -> usize {
        match self {
            Operation::Journal(_) => MAX_JOURNAL_RESPONSE,
            Operation::EventLog => MAX_EVENT_LOG_RESPONSE,
            _ => MAX_RESPONSE,
        }
    }

    /// Checks a decoded request; the error says what was wrong.
    pub fn from_request(r: Request) -> Result<Operation, &'static str> {
        use request::Op;
        let unique = |u: Vec<u8>| -> Result<[u8; 32], &'static str> {
            u.try_into().map_err(|_| "a key's unique is not 32 bytes")
        };
        match r.op.ok_or("a request without an operation")? {
            Op::Ak(_) => Ok(Operation::Ak),
            Op::Machine(_) => Ok(Operation::Machine),
            Op::EventLog(_) => Ok(Operation::EventLog),
            Op::Journal(j) => Ok(Operation::Journal(crate::journal::Query::checked(
                j.since_ms, j.lines, j.bytes,
            )?)),
            Op::NodeKey(k) => Ok(Operation::NodeKey {
                unique: unique(k.unique)?,
            }),
            Op::Sign(s) => {
                let hash = Hash::from_alg_id(s.hash).ok_or("a hash other than SHA-256/384/512")?;
                if s.digest.len() != hash.digest_len() {
                    return Err("a digest whose length is not its hash's");
                }
                Ok(Operation::Sign {
                    unique: unique(s.unique)?,
                    hash,
                    digest: s.digest,
                })
            }
            Op::Certify(c) => {
                if c.qualifying.len() > MAX_QUALIFYING {
                    return Err("qualifying data longer than 64 bytes");
                }
                Ok(Operation::Certify {
                    unique: unique(c.unique)?,
                    qualifying: c.qualifying,
                })
            }
            Op::CertifyQuote(c) => {
                if c.qualifying.len() > MAX_QUALIFYING || c.extra.len() > MAX_QUALIFYING {
                    return Err("qualifying data longer than 64 bytes");
                }
                if c.pcrs.is_empty()
                    || c.pcrs.len() > MAX_QUOTE_PCRS
                    || c.pcrs.iter().any(|&p| p >= MAX_QUOTE_PCRS as u32)
                {
                    return Err("a quote of no PCR, or of a PCR index past 23");
                }
                Ok(Operation::CertifyQuote {
                    unique: unique(c.unique)?,
                    qualifying: c.qualifying,
                    extra: c.extra,
                    pcrs: c.pcrs,
                })
            }
        }
    }

    /// The request that asks for this operation.
    pub fn to_request(&self) -> Request {
        use request::Op;
        let op = match self {
            Operation::Ak => Op::Ak(AkRequest {}),
            Operation::Machine => Op::Machine(MachineRequest {}),
            Operation::EventLog => Op::EventLog(EventLogRequest {}),
            Operation::Journal(q) => Op::Journal(JournalRequest {
                since_ms: q.since_ms,
                lines: q.lines,
                bytes: q.bytes,
            }),
            Operation::NodeKey { unique } => Op::NodeKey(NodeKeyRequest {
                unique: unique.to_vec(),
            }),
            Operation::Sign {
                unique,
                hash,
                digest,
            } => Op::Sign(SignRequest {
                unique: unique.to_vec(),
                hash: hash.alg_id(),
                digest: digest.clone(),
            }),
            Operation::Certify { unique, qualifying } => Op::Certify(CertifyRequest {
                unique: unique.to_vec(),
                qualifying: qualifying.clone(),
            }),
            Operation::CertifyQuote {
                unique,
                qualifying,
                extra,
                pcrs,
            } => Op::CertifyQuote(CertifyQuoteRequest {
                unique: unique.to_vec(),
                qualifying: qualifying.clone(),
                extra: extra.clone(),
                pcrs: pcrs.clone(),
            }),
        };
        Request { op: Some(op) }
    }
}

/// A message as a frame: its length (u32, big-endian), then its bytes.
pub fn frame(msg: &impl prost::Message) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A frame's length prefix, checked against `max` before any body is read.
pub fn body_len(prefix: [u8; 4], max: usize) -> Result<usize, &'static str> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        Err("a frame longer than the limit")
    } else {
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn operations_round_trip_and_bad_ones_are_named() {
        let ops = [
            Operation::Ak,
            Operation::NodeKey { unique: [7; 32] },
            Operation::Sign {
                unique: [1; 32],
                hash: Hash::Sha384,
                digest: vec![2; 48],
            },
            Operation::Certify {
                unique: [3; 32],
                qualifying: vec![4; 32],
            },
            Operation::CertifyQuote {
                unique: [3; 32],
                qualifying: vec![4; 32],
                extra: vec![5; 32],
                pcrs: vec![0, 4, 7],
            },
            Operation::Machine,
            Operation::EventLog,
            Operation::Journal(crate::journal::Query::checked(5, 10, 4096).unwrap()),
        ];
        for op in ops {
            let bytes = op.to_request().encode_to_vec();
            let back = Operation::from_request(Request::decode(bytes.as_slice()).unwrap());
            assert_eq!(back, Ok(op));
        }
        let bad = |r: Request| Operation::from_request(r).unwrap_err();
        assert_eq!(bad(Request { op: None }), "a request without an operation");
        let sign = |hash, len, unique: usize| Request {
            op: Some(request::Op::Sign(SignRequest {
                unique: vec![0; unique],
                hash,
                digest: vec![0; len],
            })),
        };
        assert_eq!(
            bad(sign(0x000B, 48, 32)),
            "a digest whose length is not its hash's"
        );
        assert_eq!(
            bad(sign(0x0004, 20, 32)),
            "a hash other than SHA-256/384/512"
        );
        assert_eq!(bad(sign(0x000B, 32, 31)), "a key's unique is not 32 bytes");
        let certify = Request {
            op: Some(request::Op::Certify(CertifyRequest {
                unique: vec![0; 32],
                qualifying: vec![0; 65],
            })),
        };
        assert_eq!(bad(certify), "qualifying data longer than 64 bytes");
        let journal = |lines, bytes| Request {
            op: Some(request::Op::Journal(JournalRequest {
                since_ms: 0,
                lines,
                bytes,
            })),
        };
        assert_eq!(bad(journal(0, 10)), "journal lines outside 1..=100000");
        assert_eq!(
            bad(journal(10, 2 << 20)),
            "journal bytes outside 1..=1048576"
        );
    }

    #[test]
    fn arbitrary_bytes_decode_or_fail_without_panicking() {
        let mut seed = 0x1234_5678_u32;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (seed >> 16) as u8
                })
                .collect();
            if let Ok(r) = Request::decode(bytes.as_slice()) {
                let _ = Operation::from_request(r);
            }
        }
        assert_eq!(
            body_len([0, 0, 4, 1], MAX_REQUEST),
            Err("a frame longer than the limit")
        );
        assert_eq!(body_len([0, 0, 4, 0], MAX_REQUEST), Ok(1024));
    }
}
