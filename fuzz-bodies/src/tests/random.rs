//! Fresh inputs for every target on stable: the corpus mutated by a small,
//! seeded mutator, so a body whose invariant went stale after a parser
//! change fails `cargo test` rather than the next fuzzing run. No coverage
//! guidance (that is `scripts/fuzz`'s job); the point is a few hundred
//! thousand executions near the corpus, each time with another seed.

/// splitmix64: small, fast, and the same sequence for the same seed.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    /// A position in `0..n`, more often near the start, where the headers
    /// (type, nameAlg, lengths, versions) that decide a parse are.
    fn position(&mut self, n: usize) -> usize {
        let window = match self.below(3) {
            0 => n.min(16),
            1 => n.min(64),
            _ => n,
        };
        self.below(window.max(1))
    }
}

/// Values parsers branch on: boundaries, and the TPM algorithm ids and
/// structure tags of `wire/src/tpm.rs` (the fuzzer's comparison tracing
/// finds these; a blind mutator needs them handed over).
const INTERESTING: &[&[u8]] = &[
    &[0x00],
    &[0x01],
    &[0x7f],
    &[0x80],
    &[0xff],
    &[0x00, 0x00],
    &[0xff, 0xff],
    &[0x00, 0x01],             // RSA
    &[0x00, 0x04],             // SHA-1
    &[0x00, 0x0b],             // SHA-256
    &[0x00, 0x0c],             // SHA-384
    &[0x00, 0x0d],             // SHA-512
    &[0x00, 0x10],             // NULL
    &[0x00, 0x18],             // ECDSA
    &[0x00, 0x23],             // ECC
    &[0x00, 0x03],             // NIST P-256
    &[0x00, 0x04],             // NIST P-384
    &[0x80, 0x17],             // ST_ATTEST_CERTIFY
    &[0x80, 0x18],             // ST_ATTEST_QUOTE
    &[0xff, 0x54, 0x43, 0x47], // TPM_GENERATED_VALUE
    &[0x7f, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0xff],
];

/// One fresh input: a corpus entry (or nothing) with a few mutations, or,
/// now and then, random bytes.
pub(super) fn input(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    if corpus.is_empty() || rng.below(16) == 0 {
        let len = rng.below(256);
        return (0..len).map(|_| rng.byte()).collect();
    }
    let mut data = corpus[rng.below(corpus.len())].clone();
    let rounds = 1 + rng.below(4).min(rng.below(4));
    for _ in 0..rounds {
        mutate(rng, &mut data, corpus);
    }
    data
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    const MAX_LEN: usize = 1 << 16;
    let len = data.len();
    match rng.below(11) {
        // Flip a bit.
        0 if len > 0 => {
            let i = rng.position(len);
            data[i] ^= 1 << rng.below(8);
        }
        // Replace a byte.
        1 if len > 0 => {
            let i = rng.position(len);
            data[i] = rng.byte();
        }
        // Add or subtract a little (lengths, counters, ids).
        2 if len > 0 => {
            let i = rng.position(len);
            let delta = 1 + rng.below(8) as u8;
            data[i] = if rng.below(2) == 0 {
                data[i].wrapping_add(delta)
            } else {
                data[i].wrapping_sub(delta)
            };
        }
        // Overwrite with an interesting value.
        3 if len > 0 => {
            let value = INTERESTING[rng.below(INTERESTING.len())];
            let i = rng.position(len);
            let n = value.len().min(len - i);
            data[i..i + n].copy_from_slice(&value[..n]);
        }
        // Insert random bytes.
        4 if len < MAX_LEN => {
            let i = rng.position(len + 1);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
            data.splice(i..i, bytes);
        }
        // Delete a range.
        5 if len > 0 => {
            let i = rng.position(len);
            let n = 1 + rng.below((len - i).min(32));
            data.drain(i..i + n);
        }
        // Duplicate a range.
        6 if len > 0 && len < MAX_LEN => {
            let i = rng.position(len);
            let n = 1 + rng.below((len - i).min(64));
            let copy = data[i..i + n].to_vec();
            let at = rng.position(data.len() + 1);
            data.splice(at..at, copy);
        }
        // Truncate.
        7 if len > 0 => {
            data.truncate(rng.below(len));
        }
        // Swap a value parsers branch on for another of its width (an
        // algorithm id for another, a tag for another): what a fuzzer's
        // comparison tracing does, and how a nameAlg the parser newly
        // accepts reaches the body.
        8 | 9 => substitute(rng, data),
        // Splice in the tail of another corpus entry.
        _ => {
            let other = &corpus[rng.below(corpus.len())];
            if !other.is_empty() {
                let at = rng.below(data.len() + 1);
                let from = rng.below(other.len());
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
                data.truncate(MAX_LEN);
            }
        }
    }
}

/// The [`INTERESTING`] values worth swapping for one another: two bytes or
/// more, and not all zero or all ones (which fill any buffer).
fn swappable(v: &[u8]) -> bool {
    v.len() >= 2 && !v.iter().all(|b| *b == 0) && !v.iter().all(|b| *b == 0xff)
}

/// Replaces one occurrence (in the first 4 KiB) of a [`swappable`] value
/// with another of the same width.
fn substitute(rng: &mut Rng, data: &mut [u8]) {
    let scan = &data[..data.len().min(4096)];
    let mut found = Vec::new();
    for (at, _) in scan.iter().enumerate() {
        for value in INTERESTING.iter().filter(|v| swappable(v)) {
            if scan[at..].starts_with(value) {
                found.push((at, value.len()));
            }
        }
    }
    if found.is_empty() {
        return;
    }
    let (at, width) = found[rng.below(found.len())];
    let same: Vec<&[u8]> = INTERESTING
        .iter()
        .copied()
        .filter(|v| swappable(v) && v.len() == width)
        .collect();
    let value = same[rng.below(same.len())];
    data[at..at + width].copy_from_slice(value);
}

/// How far into an input [`swaps`] looks: the headers (type, algorithm,
/// tag, version) that decide a parse.
const SWAP_WINDOW: usize = 64;

/// Every variant of `data` with one [`swappable`] value in its first
/// [`SWAP_WINDOW`] bytes replaced by each other one of the same width: a
/// complete sweep, not a sample, so a value a parser newly accepts (a
/// nameAlg, a key type, a structure tag) reaches the body on every run
/// whatever the seed.
pub(super) fn swaps(data: &[u8]) -> Vec<Vec<u8>> {
    let window = &data[..data.len().min(SWAP_WINDOW)];
    let mut out = Vec::new();
    for at in 0..window.len() {
        for value in INTERESTING.iter().filter(|v| swappable(v)) {
            if !window[at..].starts_with(value) {
                continue;
            }
            for other in INTERESTING
                .iter()
                .filter(|o| swappable(o) && o.len() == value.len() && *o != value)
            {
                let mut variant = data.to_vec();
                variant[at..at + other.len()].copy_from_slice(other);
                out.push(variant);
            }
        }
    }
    out
}

/// A seed for this run: `BC_FUZZ_SEED` when set (to replay a failure),
/// else fresh from the clock.
pub(super) fn seed() -> u64 {
    if let Some(seed) = std::env::var("BC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return seed;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Each target's own stream: the run's seed mixed with the target's name,
/// so a target's inputs do not depend on how far the others got.
pub(super) fn target_rng(seed: u64, name: &str) -> Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Rng::new(seed ^ h)
}

/// Lower-case hex, to print a failing input.
pub(super) fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}
