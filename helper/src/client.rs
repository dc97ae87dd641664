//! The unprivileged node's side. Blocking (a node key signs from rustls'
//! signer, which is synchronous), one connection kept open and opened again
//! when the helper closed it or restarted.
//!
//! Nothing the helper returns is taken on its word: a node key's public area
//! must be a P-256 signing key bound to the TPM, every signature must verify
//! against the key's public half, the AK must be an attestation key whose
//! name is its public area's, and a certification must be by that AK, of
//! that key, over the qualifying data asked for. A helper that lies is
//! caught here, before anything is used or sent.
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use prost::Message as _;

use crate::proto::{self, response, Hash, Operation, Response};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach bcd helper at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the connection to bcd helper failed: {0}")]
    Io(#[source] std::io::Error),
    #[error("bcd helper closed the connection without answering (it serves only root and its [helper] user; see its log)")]
    Closed,
    /// The helper could not do it (its TPM's error).
    #[error("bcd helper: {0}")]
    Helper(String),
    #[error("bcd helper's answer is malformed: {0}")]
    Protocol(&'static str),
    /// The answer does not check out: the helper (or whatever listens on its
    /// socket) is not to be trusted.
    #[error("bcd helper's answer does not check out: {0}")]
    Untrusted(String),
}

/// How long one operation may take, the helper's queue included.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The AK the helper announced, checked: an attestation key whose name is
/// its public area's.
#[derive(Debug, Clone)]
pub struct Ak {
    pub public: Vec<u8>,
    pub name: Vec<u8>,
    /// Which TPM the helper holds, in its words.
    pub tpm: String,
    parsed: bc_wire::tpm::Public,
}

/// A node key's public half, as the helper derived it and this side checked it.
#[derive(Debug, Clone)]
pub struct HelperKeyPublic {
    pub unique: [u8; 32],
    /// TPMT_PUBLIC.
    pub public: Vec<u8>,
    /// SubjectPublicKeyInfo (DER).
    pub spki: Vec<u8>,
    /// The uncompressed point, as ring takes it.
    point: Vec<u8>,
}

/// A connection to `bcd helper`'s socket.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    conn: Mutex<Option<UnixStream>>,
}

impl Client {
    /// A client of the helper at `path`; it connects at its first call.
    pub fn new(path: &Path) -> Client {
        Client {
            path: path.to_owned(),
            conn: Mutex::new(None),
        }
    }

    /// `tpm.ak`.
    pub fn ak(&self) -> Result<Ak, ClientError> {
        let response::Result::Ak(ak) = self.call(&Operation::Ak)? else {
            return Err(ClientError::Protocol("not an AK"));
        };
        let parsed = bc_wire::tpm::Public::parse(&ak.public)
            .map_err(|e| ClientError::Untrusted(format!("the AK's public area: {e}")))?;
        if !bc_wire::tpm::is_attestation_key(&parsed) {
            return Err(ClientError::Untrusted(
                "the AK is not a restricted P-256 signing key of the TPM".into(),
            ));
        }
        if parsed.name() != ak.name {
            return Err(ClientError::Untrusted(
                "the AK's name is not its public area's".into(),
            ));
        }
        Ok(Ak {
            public: ak.public,
            name: ak.name,
            tpm: ak.tpm,
            parsed,
        })
    }

    /// `machine.ids`: the machine's root-only identifiers and its TPM's,
    /// each bounded and printable (the helper is another process).
    pub fn machine(&self) -> Result<proto::MachineResponse, ClientError> {
        let response::Result::Machine(m) = self.call(&Operation::Machine)? else {
            return Err(ClientError::Protocol("not the machine's identifiers"));
        };
        let word = |s: &str| s.len() <= 256 && !s.chars().any(char::is_control);
        let fine = word(&m.product_uuid)
            && word(&m.product_serial)
            && word(&m.manufacturer)
            && word(&m.vendor)
            && word(&m.firmware)
            && (m.ek_sha256.is_empty() || m.ek_sha256.len() == 32)
            && m.pcr_banks.len() <= 16
            && m.pcr_banks.iter().all(|b| b.len() <= 16 && word(b));
        if !fine {
            return Err(ClientError::Untrusted(
                "the machine's identifiers are not short printable words".into(),
            ));
        }
        Ok(m)
    }

    /// `eventlog.read`: the TCG event log, as the helper (root) read it,
    /// within [`bc_wire::tpm::MAX_EVENT_LOG`]; the control plane parses it.
    pub fn event_log(&self) -> Result<Vec<u8>, ClientError> {
        let response::Result::EventLog(l) = self.call(&Operation::EventLog)? else {
            return Err(ClientError::Protocol("not the event log"));
        };
        if l.log.len() > bc_wire::tpm::MAX_EVENT_LOG {
            return Err(ClientError::Untrusted(
                "an event log larger than any the control plane accepts".into(),
            ));
        }
        Ok(l.log)
    }

    /// `system.journal`: the system journal of bcd's units within `query`,
    /// checked to be within its bounds. On a connection of its own, so a
    /// slow read does not hold up the node's signatures.
    pub fn journal(&self, query: &crate::journal::Query) -> Result<String, ClientError> {
        let op = Operation::Journal(*query);
        let mut stream = self.connect()?;
        let response::Result::Journal(j) = into_result(exchange(
            &mut stream,
            &proto::frame(&op.to_request()),
            op.max_response(),
        )?)?
        else {
            return Err(ClientError::Protocol("not the system journal"));
        };
        if !crate::journal::within(&j.text, query) {
            return Err(ClientError::Untrusted(
                "the system journal's text is not printable lines within the bounds asked for"
                    .into(),
            ));
        }
        Ok(j.text)
    }

    /// `tpm.nodekey`: the key `unique` derives, its public half checked.
    pub fn node_key(&self, unique: &[u8; 32]) -> Result<HelperKeyPublic, ClientError> {
        let response::Result::NodeKey(k) = self.call(&Operation::NodeKey { unique: *unique })?
        else {
            return Err(ClientError::Protocol("not a node key"));
        };
        let untrusted = |what: &str| ClientError::Untrusted(format!("the node key {what}"));
        let parsed = bc_wire::tpm::Public::parse(&k.public)
            .map_err(|e| untrusted(&format!("does not parse: {e}")))?;
        use bc_wire::tpm::attr;
        let bound = attr::FIXED_TPM | attr::FIXED_PARENT | attr::SENSITIVE_DATA_ORIGIN | attr::SIGN;
        if !parsed.has(bound) || parsed.has(attr::DECRYPT) || parsed.has(attr::RESTRICTED) {
            return Err(untrusted(
                "is not an unrestricted signing key bound to the TPM",
            ));
        }
        let verifying = parsed
            .p256_key()
            .map_err(|_| untrusted("is not a P-256 key"))?;
        let spki = parsed
            .p256_spki_der()
            .map_err(|_| untrusted("is not a P-256 key"))?;
        let point = verifying.to_sec1_point(false).as_bytes().to_vec();
        Ok(HelperKeyPublic {
            unique: *unique,
            public: k.public,
            spki,
            point,
        })
    }

    /// ES256 by `key` over `msg` (the helper signs its SHA-256), P1363
    /// `r‖s`, verified against the key's public half. What a node key does
    /// for a TLS handshake, so the check is ring's (about 7 times faster than
    /// a prehash check here: signing through the helper stays within 90 %
    /// of signing direct).
    pub fn sign(&self, key: &HelperKeyPublic, msg: &[u8]) -> Result<[u8; 64], ClientError> {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(msg);
        let signature = self.sign_raw(key, Hash::Sha256, &digest)?;
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            &key.point,
        )
        .verify(msg, &signature)
        .map_err(|_| bad_signature())?;
        Ok(signature)
    }

    /// `tpm.sign`, unchecked: the caller above checks.
    fn sign_raw(
        &self,
        key: &HelperKeyPublic,
        hash: Hash,
        digest: &[u8],
    ) -> Result<[u8; 64], ClientError> {
        let op = Operation::Sign {
            unique: key.unique,
            hash,
            digest: digest.to_vec(),
        };
        let response::Result::Sign(s) = self.call(&op)? else {
            return Err(ClientError::Protocol("not a signature"));
        };
        s.signature
            .as_slice()
            .try_into()
            .map_err(|_| bad_signature())
    }

    /// `tpm.certify` of `key` by the AK over `qualifying`: the TPMS_ATTEST
    /// and TPMT_SIGNATURE, verified to be `ak`'s certification of exactly
    /// this key over exactly these bytes.
    pub fn certify(
        &self,
        ak: &Ak,
        key: &HelperKeyPublic,
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), ClientError> {
        let op = Operation::Certify {
            unique: key.unique,
            qualifying: qualifying.to_vec(),
        };
        let response::Result::Certify(c) = self.call(&op)? else {
            return Err(ClientError::Protocol("not a certification"));
        };
        checked(ak, key, qualifying, &c)?;
        Ok((c.certify_info, c.signature))
    }

    /// `tpm.certify_quote`: [`Self::certify`] of `key` over `qualifying`
    /// (verified as that one is), and in the same TPM connection the AK's
    /// quote over `extra` of `pcrs` in every populated bank (the control
    /// plane verifies it).
    pub fn certify_quote(
        &self,
        ak: &Ak,
        key: &HelperKeyPublic,
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<crate::server::CertifiedQuote, ClientError> {
        let op = Operation::CertifyQuote {
            unique: key.unique,
            qualifying: qualifying.to_vec(),
            extra: extra.to_vec(),
            pcrs: pcrs.to_vec(),
        };
        let response::Result::CertifyQuote(q) = self.call(&op)? else {
            return Err(ClientError::Protocol("not a certification and quote"));
        };
        let c = q
            .certify
            .ok_or(ClientError::Protocol("a quote without its certification"))?;
        checked(ak, key, qualifying, &c)?;
        Ok(crate::server::CertifiedQuote {
            certify_info: c.certify_info,
            signature: c.signature,
            quote: q.quote,
            quote_signature: q.quote_signature,
            pcr_values: q.pcr_values,
        })
    }

    /// One request and its response. A connection the helper closed since
    /// the last call (idle, restarted) is replaced once: every operation is
    /// safe to repeat.
    fn call(&self, op: &Operation) -> Result<response::Result, ClientError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| ClientError::Protocol("an earlier call panicked"))?;
        let request = proto::frame(&op.to_request());
        let max = op.max_response();
        let reused = conn.is_some();
        for attempt in 0..2 {
            if conn.is_none() {
                *conn = Some(self.connect()?);
            }
            let Some(stream) = conn.as_mut() else {
                continue;
            };
            match exchange(stream, &request, max) {
                Ok(r) => return into_result(r),
                Err(e) => {
                    *conn = None;
                    let stale = matches!(e, ClientError::Io(_) | ClientError::Closed);
                    if !(reused && stale && attempt == 0) {
                        return Err(e);
                    }
                }
            }
        }
        Err(ClientError::Closed)
    }

    fn connect(&self) -> Result<UnixStream, ClientError> {
        let fail = |source| ClientError::Connect {
            path: self.path.display().to_string(),
            source,
        };
        let stream = UnixStream::connect(&self.path).map_err(fail)?;
        stream.set_read_timeout(Some(TIMEOUT)).map_err(fail)?;
        stream.set_write_timeout(Some(TIMEOUT)).map_err(fail)?;
        Ok(stream)
    }
}

fn bad_signature() -> ClientError {
    ClientError::Untrusted("a signature that does not verify against the key's public half".into())
}

/// One request and its response of at most `max` bytes.
fn exchange(stream: &mut UnixStream, request: &[u8], max: usize) -> Result<Response, ClientError> {
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionReset => ClientError::Closed,
        _ => ClientError::Io(e),
    };
    // A helper over its limit answers before it closes, maybe before this
    // request is written: its words are still there to read.
    let written = stream.write_all(request).map_err(closed);
    if let Err(e @ ClientError::Io(_)) = written {
        return Err(e);
    }
    // Usually the whole response in the first read; the helper sends
    // nothing unasked, so nothing past it is read. The buffer grows to a
    // longer response's announced length (within `max`) only.
    let mut buf = vec![0u8; 4 + proto::MAX_RESPONSE.min(max)];
    let mut filled = 0;
    let len = loop {
        if let Some(prefix) = buf[..filled].first_chunk::<4>() {
            let len = 4 + proto::body_len(*prefix, max).map_err(ClientError::Protocol)?;
            if filled >= len {
                break len;
            }
            if buf.len() < len {
                buf.resize(len, 0);
            }
        }
        match stream.read(&mut buf[filled..]).map_err(closed) {
            Ok(0) => return Err(written.err().unwrap_or(ClientError::Closed)),
            Ok(n) => filled += n,
            Err(e) => return Err(written.err().unwrap_or(e)),
        }
    };
    if filled > len {
        return Err(ClientError::Protocol("more than one response"));
    }
    Response::decode(&buf[4..len]).map_err(|_| ClientError::Protocol("it does not decode"))
}

fn into_result(r: Response) -> Result<response::Result, ClientError> {
    match r.result {
        None => Err(ClientError::Protocol("an empty response")),
        Some(response::Result::Error(e)) => {
            // The helper's words, bounded: it is another process.
            Err(ClientError::Helper(e.message.chars().take(500).collect()))
        }
        Some(r) => Ok(r),
    }
}

/// Whether `c` is `ak`'s certification of exactly `key` over exactly
/// `qualifying`.
fn checked(
    ak: &Ak,
    key: &HelperKeyPublic,
    qualifying: &[u8],
    c: &crate::proto::CertifyResponse,
) -> Result<(), ClientError> {
    bc_wire::tpm::verify_key_certification(
        &ak.parsed,
        &key.public,
        &c.certify_info,
        &c.signature,
        qualifying,
        &key.spki,
    )
    .map(|_| ())
    .map_err(|e| {
        ClientError::Untrusted(format!(
            "the certification is not the announced AK's of this key: {e}"
        ))
    })
}
