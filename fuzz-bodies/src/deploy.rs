//! What `deploy.image` reads from the control plane: the image stream
//! (zstd-decoded under the command's byte count) and the NoCloud seed
//! document, whose parser must accept exactly what the control plane
//! stores.

use std::io::Read;

/// A seed document as the agent parses it, pinned by its own digest (so
/// the parse runs past the digest check), against the control plane's
/// `check_seed`: the two must agree, or a seed the control plane stored
/// would fail the deploy only after the disk was written (or the agent
/// would write a document the control plane never vetted).
pub fn deploy_seed(data: &[u8]) {
    let sha: String = bc_wire::sha256(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let agent = bcd::DeploySeed::parse(data, &sha);
    let cp = bc_controlplane::deploy::check_seed(data);
    assert_eq!(
        agent.is_ok(),
        cp.is_ok(),
        "agent {agent:?}, control plane {cp:?}"
    );
    // Errors never quote the document (it carries a token).
    if let Err(e) = &agent {
        assert!(e.starts_with("the seed is not"), "{e}");
    }
    let wrong = bcd::DeploySeed::parse(data, &"0".repeat(64));
    assert!(wrong.is_err_and(|e| e.starts_with("seed digest mismatch")));
}

/// The largest output the body lets through (the command's `bytes`).
const IMAGE_CAP: usize = 1 << 20;

/// How a capped read ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Done,
    Failed,
    OverCap,
}

/// Reads `r` to its end as `deploy.image` does (refusing past `cap`),
/// `chunk` bytes at a time: what came out (at most `cap` + `chunk`), and
/// how it ended.
fn read_capped(mut r: impl Read, chunk: usize, cap: usize) -> (Vec<u8>, Ended) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return (out, Ended::Done),
            Ok(n) => {
                assert!(n <= chunk, "read {n} into a buffer of {chunk}");
                out.extend_from_slice(&buf[..n]);
                if out.len() > cap {
                    return (out, Ended::OverCap);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
                return (out, Ended::Failed);
            }
        }
    }
}

/// An image stream: the first byte picks the cap (up to [`IMAGE_CAP`]),
/// the rest is decoded as zstd (when it starts with the magic, as `images
/// add` detects it; else as a stream that must be refused), once in large
/// reads and once in small ones: the decoder must never panic, and both
/// must give the same bytes and the same end (a block's output does not
/// depend on the reader's buffer).
pub fn deploy_image(data: &[u8]) {
    let Some((&c, stream)) = data.split_first() else {
        return;
    };
    let cap = (usize::from(c) + 1) * (IMAGE_CAP / 256);
    let decoder = || bc_wire::image::Decoder::new(std::io::Cursor::new(stream));
    let (big, big_end) = read_capped(decoder(), 64 << 10, cap);
    if !bc_wire::image::is_zstd(stream) {
        assert_eq!(big_end, Ended::Failed, "not zstd, yet decoded");
    }
    let (small, small_end) = read_capped(decoder(), 4093, cap);
    assert_eq!(big_end, small_end);
    let n = big.len().min(small.len()).min(cap + 1);
    assert_eq!(big[..n], small[..n]);
    if big_end != Ended::OverCap {
        assert_eq!(big, small);
    }
}
