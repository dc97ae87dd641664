//! The log's framing: the SHA-1 format (TCG_PCR_EVENT, TPM 1.2 and old
//! firmware) and the crypto-agile one (a Spec ID event, then
//! TCG_PCR_EVENT2 with one digest per algorithm it declares). Every length
//! read from the log is checked against what is left and against
//! [`Limits`] before anything is allocated.

use thiserror::Error;

use crate::alg::Alg;

/// EV_NO_ACTION: logged, never extended.
pub(crate) const EV_NO_ACTION: u32 = 0x3;

/// The signature that opens a crypto-agile log's first event.
const SPEC_ID_03: &[u8; 16] = b"Spec ID Event03\0";

/// The most algorithms a Spec ID event may declare (the TCG registry has
/// about a dozen hash algorithms).
const MAX_ALGORITHMS: u32 = 16;

/// The largest digest an undeclared-by-us algorithm may have (SHA-512's).
const MAX_DIGEST_SIZE: u16 = 64;

/// The highest PCR index a PC Client log extends.
pub(crate) const MAX_PCR: u32 = 23;

/// Bounds on what one log may cost. Defaults: a real log is 10-100 KiB
/// with a few hundred events; the defaults leave room for servers with
/// many option ROMs and long MokLists, and no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The whole log, in bytes.
    pub max_bytes: usize,
    /// Events, the Spec ID event included.
    pub max_events: usize,
    /// One event's data, in bytes.
    pub max_event_bytes: usize,
    /// Entries of one list inside an event (signatures of a signature
    /// database, device path nodes, GPT partitions). The structures nest
    /// at most three deep by their format (variable, signature list,
    /// signature) and the parser never recurses, so this bounds the work.
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 4 << 20,
            max_events: 10_000,
            max_event_bytes: 1 << 20,
            max_entries: 4096,
        }
    }
}

/// Why a log was refused; every variant names where (byte offset of the
/// event, its index counting the first event as 0).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("the event log is empty")]
    Empty,
    #[error("the event log is {size} bytes, more than the {max} allowed")]
    TooLarge { size: usize, max: usize },
    #[error("the event log has more than {max} events (at offset {offset})")]
    TooManyEvents { max: usize, offset: usize },
    #[error("event {index} at offset {offset} is cut short: {what} runs past the end of the log")]
    Truncated {
        index: usize,
        offset: usize,
        what: &'static str,
    },
    #[error(
        "event {index} at offset {offset} has {size} bytes of data, more than the {max} allowed"
    )]
    EventTooLarge {
        index: usize,
        offset: usize,
        size: u64,
        max: usize,
    },
    #[error("event {index} at offset {offset} extends PCR {pcr}, beyond PCR 23")]
    PcrIndex {
        index: usize,
        offset: usize,
        pcr: u32,
    },
    #[error("the Spec ID event is malformed: {reason}")]
    SpecId { reason: &'static str },
    #[error("the Spec ID event declares algorithm {alg_id:#06x} with a {declared}-byte digest, but that algorithm's digests are {expected} bytes")]
    SpecIdDigestSize {
        alg_id: u16,
        declared: u16,
        expected: usize,
    },
    #[error("the Spec ID event declares algorithm {alg_id:#06x} with a {declared}-byte digest: unknown algorithms may have 1 to 64 bytes")]
    SpecIdUnknownSize { alg_id: u16, declared: u16 },
    #[error("event {index} at offset {offset} has {count} digests, but the Spec ID event declares only {declared} algorithms")]
    DigestCount {
        index: usize,
        offset: usize,
        count: u32,
        declared: usize,
    },
    #[error("event {index} at offset {offset} has a digest of algorithm {alg_id:#06x}, which the Spec ID event does not declare (or twice)")]
    UndeclaredAlgorithm {
        index: usize,
        offset: usize,
        alg_id: u16,
    },
}

/// Which of the two framings the log uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// TCG_PCR_EVENT throughout: one SHA-1 digest per event.
    Sha1,
    /// A Spec ID event ("Spec ID Event03"), then TCG_PCR_EVENT2.
    CryptoAgile,
}

/// One digest of an event, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    /// TPM_ALG_ID (0x0004 SHA-1, 0x000B SHA-256, ...).
    pub alg_id: u16,
    pub value: Vec<u8>,
}

impl Digest {
    /// The bank this digest extends, if bcd knows its hash.
    pub fn alg(&self) -> Option<Alg> {
        Alg::from_id(self.alg_id)
    }
}

/// One event of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its position in the log, the first (Spec ID) event being 0.
    pub index: usize,
    /// Its byte offset in the log.
    pub offset: usize,
    pub pcr: u32,
    pub event_type: u32,
    pub digests: Vec<Digest>,
    pub data: Vec<u8>,
}

impl Event {
    /// This event's digest in `alg`'s bank.
    pub fn digest(&self, alg: Alg) -> Option<&[u8]> {
        self.digests
            .iter()
            .find(|d| d.alg_id == alg.id())
            .map(|d| d.value.as_slice())
    }

    /// Whether every digest of a known algorithm is the hash of `bytes`
    /// (the events whose data is what was measured: variables, actions,
    /// separators). False when the event has no digest bcd can check.
    pub fn digests_match(&self, bytes: &[u8]) -> bool {
        let mut checked = false;
        for d in &self.digests {
            if let Some(alg) = d.alg() {
                if alg.hash(bytes) != d.value {
                    return false;
                }
                checked = true;
            }
        }
        checked
    }
}

/// A parsed log: its events in order, with what its first event declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLog {
    pub format: Format,
    /// The algorithms (TPM_ALG_ID, digest size) every event carries: the
    /// Spec ID event's list, or SHA-1 alone.
    pub algorithms: Vec<(u16, u16)>,
    pub events: Vec<Event>,
    /// Zero (or 0xFF) bytes after the last event, as firmware that copies
    /// a fixed-size log area leaves them.
    pub trailing_padding: usize,
}

impl EventLog {
    /// The banks this log can be replayed in (its algorithms bcd knows).
    pub fn banks(&self) -> Vec<Alg> {
        self.algorithms
            .iter()
            .filter_map(|(id, _)| Alg::from_id(*id))
            .collect()
    }
}

/// A bounds-checked reader over the log.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.pos..).unwrap_or(&[])
    }
}

/// Parses a log in either format, within `limits`.
pub fn parse(bytes: &[u8], limits: &Limits) -> Result<EventLog, ParseError> {
    if bytes.is_empty() {
        return Err(ParseError::Empty);
    }
    if bytes.len() > limits.max_bytes {
        return Err(ParseError::TooLarge {
            size: bytes.len(),
            max: limits.max_bytes,
        });
    }
    let mut r = Reader { bytes, pos: 0 };
    // The first event is always TCG_PCR_EVENT (SHA-1 framing).
    let first = read_sha1_event(&mut r, 0, limits)?;
    let mut log = EventLog {
        format: Format::Sha1,
        algorithms: vec![(Alg::Sha1.id(), 20)],
        events: Vec::new(),
        trailing_padding: 0,
    };
    if first.pcr == 0 && first.event_type == EV_NO_ACTION && first.data.starts_with(SPEC_ID_03) {
        let (algorithms, overrun) = parse_spec_id(&first.data)?;
        // tpm2-tools reads a vendorInfo that runs past the event's size
        // from the bytes that follow (its specid-vendordata.bin fixture):
        // so does bcd, as part of the Spec ID event, never as an event.
        if overrun > 0 {
            r.take(overrun).ok_or(ParseError::SpecId {
                reason: "its vendor info is cut short",
            })?;
        }
        log.algorithms = algorithms;
        log.format = Format::CryptoAgile;
    }
    log.events.push(first);
    loop {
        let rest = r.rest();
        if rest.is_empty() {
            break;
        }
        if is_padding(rest) {
            log.trailing_padding = rest.len();
            break;
        }
        let index = log.events.len();
        if index >= limits.max_events {
            return Err(ParseError::TooManyEvents {
                max: limits.max_events,
                offset: r.pos,
            });
        }
        let event = match log.format {
            Format::Sha1 => read_sha1_event(&mut r, index, limits)?,
            Format::CryptoAgile => read_agile_event(&mut r, index, &log.algorithms, limits)?,
        };
        log.events.push(event);
    }
    Ok(log)
}

/// Whether what is left is fill: all zero or all 0xFF bytes. Only checked
/// when the next event would start with a zero PCR index and type (or
/// 0xFF), so a log of real events is read once.
fn is_padding(rest: &[u8]) -> bool {
    let head = rest.get(..8).unwrap_or(rest);
    (head.iter().all(|&b| b == 0) && rest.iter().all(|&b| b == 0))
        || (head.iter().all(|&b| b == 0xff) && rest.iter().all(|&b| b == 0xff))
}

fn truncated(index: usize, offset: usize, what: &'static str) -> ParseError {
    ParseError::Truncated {
        index,
        offset,
        what,
    }
}

fn read_header(r: &mut Reader<'_>, index: usize) -> Result<(u32, u32), ParseError> {
    let offset = r.pos;
    let pcr = r.u32().ok_or(truncated(index, offset, "the PCR index"))?;
    let event_type = r.u32().ok_or(truncated(index, offset, "the event type"))?;
    // Windows logs its log-only EV_NO_ACTION events under PCR -1.
    if pcr > MAX_PCR && event_type != EV_NO_ACTION {
        return Err(ParseError::PcrIndex { index, offset, pcr });
    }
    Ok((pcr, event_type))
}

fn read_data(
    r: &mut Reader<'_>,
    index: usize,
    offset: usize,
    limits: &Limits,
) -> Result<Vec<u8>, ParseError> {
    let size = r.u32().ok_or(truncated(index, offset, "the event size"))?;
    if size as usize > limits.max_event_bytes {
        return Err(ParseError::EventTooLarge {
            index,
            offset,
            size: u64::from(size),
            max: limits.max_event_bytes,
        });
    }
    let data = r
        .take(size as usize)
        .ok_or(truncated(index, offset, "the event data"))?;
    Ok(data.to_vec())
}

fn read_sha1_event(r: &mut Reader<'_>, index: usize, limits: &Limits) -> Result<Event, ParseError> {
    let offset = r.pos;
    let (pcr, event_type) = read_header(r, index)?;
    let digest = r
        .take(20)
        .ok_or(truncated(index, offset, "the SHA-1 digest"))?;
    let data = read_data(r, index, offset, limits)?;
    Ok(Event {
        index,
        offset,
        pcr,
        event_type,
        digests: vec![Digest {
            alg_id: Alg::Sha1.id(),
            value: digest.to_vec(),
        }],
        data,
    })
}

fn read_agile_event(
    r: &mut Reader<'_>,
    index: usize,
    algorithms: &[(u16, u16)],
    limits: &Limits,
) -> Result<Event, ParseError> {
    let offset = r.pos;
    let (pcr, event_type) = read_header(r, index)?;
    let count = r
        .u32()
        .ok_or(truncated(index, offset, "the digest count"))?;
    // At most one digest per declared algorithm: a count beyond that is a
    // lie about the framing. Fewer happens in real logs (tpm2-tools'
    // event-uefiaction.bin declares four banks, its events carry two);
    // replay then leaves that bank's PCR unknown.
    if count as usize > algorithms.len() {
        return Err(ParseError::DigestCount {
            index,
            offset,
            count,
            declared: algorithms.len(),
        });
    }
    let mut digests: Vec<Digest> = Vec::with_capacity(algorithms.len());
    for _ in 0..count {
        let b = r
            .take(2)
            .ok_or(truncated(index, offset, "a digest's algorithm"))?;
        let alg_id = u16::from_le_bytes([b[0], b[1]]);
        let size = algorithms
            .iter()
            .find(|(id, _)| *id == alg_id)
            .map(|(_, size)| *size)
            .filter(|_| !digests.iter().any(|d| d.alg_id == alg_id))
            .ok_or(ParseError::UndeclaredAlgorithm {
                index,
                offset,
                alg_id,
            })?;
        let value = r
            .take(usize::from(size))
            .ok_or(truncated(index, offset, "a digest"))?;
        digests.push(Digest {
            alg_id,
            value: value.to_vec(),
        });
    }
    let data = read_data(r, index, offset, limits)?;
    Ok(Event {
        index,
        offset,
        pcr,
        event_type,
        digests,
        data,
    })
}

/// TCG_EfiSpecIDEventStruct: the algorithms (and their digest sizes)
/// every later event carries, and how many bytes of vendor info lie past
/// the event's data.
fn parse_spec_id(data: &[u8]) -> Result<(Vec<(u16, u16)>, usize), ParseError> {
    let spec = |reason| ParseError::SpecId { reason };
    let mut r = Reader {
        bytes: data,
        pos: 0,
    };
    // signature, platformClass, version minor/major/errata, uintnSize
    r.take(16 + 4 + 4).ok_or(spec("shorter than its header"))?;
    let n = r.u32().ok_or(spec("no numberOfAlgorithms"))?;
    if n == 0 || n > MAX_ALGORITHMS {
        return Err(spec("it declares no algorithm, or more than 16"));
    }
    let mut algorithms: Vec<(u16, u16)> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let b = r.take(4).ok_or(spec("its algorithm list is cut short"))?;
        let alg_id = u16::from_le_bytes([b[0], b[1]]);
        let declared = u16::from_le_bytes([b[2], b[3]]);
        match Alg::from_id(alg_id) {
            Some(alg) if usize::from(declared) != alg.size() => {
                return Err(ParseError::SpecIdDigestSize {
                    alg_id,
                    declared,
                    expected: alg.size(),
                })
            }
            None if declared == 0 || declared > MAX_DIGEST_SIZE => {
                return Err(ParseError::SpecIdUnknownSize { alg_id, declared })
            }
            _ => {}
        }
        if algorithms.iter().any(|(id, _)| *id == alg_id) {
            return Err(spec("it declares an algorithm twice"));
        }
        algorithms.push((alg_id, declared));
    }
    let vendor = r.take(1).ok_or(spec("no vendorInfoSize"))?;
    let overrun = usize::from(vendor[0]).saturating_sub(r.rest().len());
    Ok((algorithms, overrun))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Spec ID event declaring `algs` (id, size).
    fn spec_id(algs: &[(u16, u16)]) -> Vec<u8> {
        let mut data = SPEC_ID_03.to_vec();
        data.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 2]);
        data.extend_from_slice(&(algs.len() as u32).to_le_bytes());
        for (id, size) in algs {
            data.extend_from_slice(&id.to_le_bytes());
            data.extend_from_slice(&size.to_le_bytes());
        }
        data.push(0);
        let mut out = Vec::new();
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&EV_NO_ACTION.to_le_bytes());
        out.extend_from_slice(&[0; 20]);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
        out
    }

    /// A TCG_PCR_EVENT2 with `digests` (id, value) and `data`, its digest
    /// count as given.
    fn event2(pcr: u32, count: u32, digests: &[(u16, Vec<u8>)], data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&pcr.to_le_bytes());
        out.extend_from_slice(&0x8000_0007u32.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        for (id, value) in digests {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(value);
        }
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    fn sha256_log(events: usize) -> Vec<u8> {
        let mut log = spec_id(&[(0x0b, 32)]);
        for _ in 0..events {
            log.extend(event2(4, 1, &[(0x0b, vec![1; 32])], b"action"));
        }
        log
    }

    #[test]
    fn a_well_formed_log_parses() {
        let log = parse(&sha256_log(3), &Limits::default()).unwrap();
        assert_eq!(log.format, Format::CryptoAgile);
        assert_eq!(log.events.len(), 4);
        assert_eq!(log.events[3].digest(Alg::Sha256), Some(&[1u8; 32][..]));
        assert_eq!(log.banks(), vec![Alg::Sha256]);
    }

    #[test]
    fn oversize_log_is_refused() {
        let bytes = sha256_log(3);
        let limits = Limits {
            max_bytes: bytes.len() - 1,
            ..Limits::default()
        };
        assert_eq!(
            parse(&bytes, &limits),
            Err(ParseError::TooLarge {
                size: bytes.len(),
                max: bytes.len() - 1
            })
        );
        assert_eq!(parse(&[], &Limits::default()), Err(ParseError::Empty));
    }

    #[test]
    fn too_many_events_is_refused() {
        let limits = Limits {
            max_events: 3,
            ..Limits::default()
        };
        assert!(parse(&sha256_log(2), &limits).is_ok());
        assert!(matches!(
            parse(&sha256_log(3), &limits),
            Err(ParseError::TooManyEvents { max: 3, .. })
        ));
    }

    #[test]
    fn oversize_event_is_refused_naming_it() {
        let mut bytes = spec_id(&[(0x0b, 32)]);
        let at = bytes.len();
        bytes.extend(event2(4, 1, &[(0x0b, vec![1; 32])], &[0; 100]));
        let limits = Limits {
            max_event_bytes: 99,
            ..Limits::default()
        };
        assert_eq!(
            parse(&bytes, &limits),
            Err(ParseError::EventTooLarge {
                index: 1,
                offset: at,
                size: 100,
                max: 99
            })
        );
        // A size beyond the log is cut short, not allocated.
        let mut lying = spec_id(&[(0x0b, 32)]);
        let mut e = event2(4, 1, &[(0x0b, vec![1; 32])], b"");
        let n = e.len();
        e[n - 4..].copy_from_slice(&1000u32.to_le_bytes());
        lying.extend(e);
        assert!(matches!(
            parse(&lying, &Limits::default()),
            Err(ParseError::Truncated {
                index: 1,
                what: "the event data",
                ..
            })
        ));
    }

    #[test]
    fn a_lying_digest_count_is_refused() {
        let mut bytes = spec_id(&[(0x0b, 32)]);
        bytes.extend(event2(
            4,
            2,
            &[(0x0b, vec![1; 32]), (0x0b, vec![1; 32])],
            b"",
        ));
        assert!(matches!(
            parse(&bytes, &Limits::default()),
            Err(ParseError::DigestCount {
                index: 1,
                count: 2,
                declared: 1,
                ..
            })
        ));
        let mut huge = spec_id(&[(0x0b, 32)]);
        huge.extend(event2(4, u32::MAX, &[], b""));
        assert!(matches!(
            parse(&huge, &Limits::default()),
            Err(ParseError::DigestCount { .. })
        ));
        // A digest of an algorithm the Spec ID did not declare, or twice.
        let mut two = spec_id(&[(0x0b, 32), (0x04, 20)]);
        two.extend(event2(
            4,
            2,
            &[(0x0b, vec![1; 32]), (0x0b, vec![1; 32])],
            b"",
        ));
        assert!(matches!(
            parse(&two, &Limits::default()),
            Err(ParseError::UndeclaredAlgorithm {
                index: 1,
                alg_id: 0x0b,
                ..
            })
        ));
    }

    #[test]
    fn spec_id_algorithm_sizes_are_checked() {
        assert_eq!(
            parse(&spec_id(&[(0x0b, 20)]), &Limits::default()),
            Err(ParseError::SpecIdDigestSize {
                alg_id: 0x0b,
                declared: 20,
                expected: 32
            })
        );
        for size in [0, 65, 0xffff] {
            assert_eq!(
                parse(&spec_id(&[(0x27, size)]), &Limits::default()),
                Err(ParseError::SpecIdUnknownSize {
                    alg_id: 0x27,
                    declared: size
                })
            );
        }
        // An unknown algorithm of a plausible size is carried, not replayed.
        let mut bytes = spec_id(&[(0x0b, 32), (0x27, 32)]);
        bytes.extend(event2(
            4,
            2,
            &[(0x27, vec![2; 32]), (0x0b, vec![1; 32])],
            b"",
        ));
        let log = parse(&bytes, &Limits::default()).unwrap();
        assert_eq!(log.banks(), vec![Alg::Sha256]);
        assert!(matches!(
            parse(&spec_id(&[]), &Limits::default()),
            Err(ParseError::SpecId { .. })
        ));
    }

    #[test]
    fn pcr_beyond_23_is_refused_and_padding_is_not_an_event() {
        let mut bytes = spec_id(&[(0x0b, 32)]);
        bytes.extend(event2(24, 1, &[(0x0b, vec![1; 32])], b""));
        assert!(matches!(
            parse(&bytes, &Limits::default()),
            Err(ParseError::PcrIndex {
                index: 1,
                pcr: 24,
                ..
            })
        ));
        for fill in [0u8, 0xff] {
            let mut padded = sha256_log(2);
            padded.extend([fill; 300]);
            let log = parse(&padded, &Limits::default()).unwrap();
            assert_eq!((log.events.len(), log.trailing_padding), (3, 300));
        }
    }

    #[test]
    fn every_cut_of_a_log_is_refused_without_panic() {
        let bytes = sha256_log(3);
        let first = spec_id(&[(0x0b, 32)]).len();
        for n in 1..bytes.len() {
            let r = parse(&bytes[..n], &Limits::default());
            if n < first {
                assert!(r.is_err(), "{n}");
            }
        }
    }
}
