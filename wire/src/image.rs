//! Deploy images as they travel: raw, or a zstd stream (`images add`
//! detects it by its magic; `deploy.image` says which with `compression`).
//! Both sides decode with [`Decoder`], so the control plane's `images add`
//! measures exactly what the agent will write.
//!
//! zstd here is ruzstd (pure Rust): the ramdisk's bcd stays one static
//! binary with no C library, and decoding is all either side needs.

use std::io::{self, Read};

use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// The first bytes of a zstd frame (RFC 8878 §3.1.1).
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The largest zstd window accepted (what the decoder may allocate): the
/// `zstd` tool's levels all fit in it without `--long`.
pub const MAX_WINDOW: u64 = 128 << 20;

/// Whether `head` (the stream's first bytes) starts a zstd frame.
pub fn is_zstd(head: &[u8]) -> bool {
    head.starts_with(&ZSTD_MAGIC)
}

/// The raw bytes of a zstd stream of one or more frames (`pzstd` writes
/// several), each frame's content checksum checked where it has one. A
/// stream that does not decode, or whose checksum differs, is an error of
/// kind `InvalidData`; an empty stream too.
pub struct Decoder<R: Read> {
    source: Peek<R>,
    frame: FrameDecoder,
    in_frame: bool,
    frames: u64,
}

impl<R: Read> Decoder<R> {
    pub fn new(source: R) -> Self {
        let mut frame = FrameDecoder::new();
        frame.set_max_window_size(MAX_WINDOW);
        Decoder {
            source: Peek {
                inner: source,
                peeked: None,
            },
            frame,
            in_frame: false,
            frames: 0,
        }
    }

    /// Ends the current frame: its checksum, if it carries one, must be
    /// the one of what was decoded.
    fn end_frame(&mut self) -> io::Result<()> {
        self.in_frame = false;
        if let (Some(sent), Some(got)) = (
            self.frame.get_checksum_from_data(),
            self.frame.get_calculated_checksum(),
        ) {
            if sent != got {
                return Err(invalid("a frame's content checksum does not match"));
            }
        }
        Ok(())
    }
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.source.at_end()? {
                    if self.frames == 0 {
                        return Err(invalid("empty"));
                    }
                    return Ok(0);
                }
                self.frame.init(&mut self.source).map_err(invalid)?;
                self.in_frame = true;
                self.frames += 1;
            }
            while self.frame.can_collect() == 0 && !self.frame.is_finished() {
                self.frame
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(invalid)?;
            }
            let n = self.frame.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.frame.is_finished() && self.frame.can_collect() == 0 {
                self.end_frame()?;
            }
        }
    }
}

/// A reader that can tell its end without losing a byte.
struct Peek<R> {
    inner: R,
    peeked: Option<u8>,
}

impl<R: Read> Peek<R> {
    fn at_end(&mut self) -> io::Result<bool> {
        if self.peeked.is_some() {
            return Ok(false);
        }
        let mut b = [0u8; 1];
        loop {
            match self.inner.read(&mut b) {
                Ok(0) => return Ok(true),
                Ok(_) => {
                    self.peeked = Some(b[0]);
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl<R: Read> Read for Peek<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match (self.peeked.take(), buf.first_mut()) {
            (Some(b), Some(first)) => {
                *first = b;
                Ok(1)
            }
            (peeked, _) => {
                self.peeked = peeked;
                self.inner.read(buf)
            }
        }
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not a valid zstd stream: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruzstd::encoding::{compress_to_vec, CompressionLevel};

    fn decode(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        Decoder::new(bytes).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn decodes_one_frame_and_several() {
        let raw: Vec<u8> = (0..300_000u32).map(|i| (i % 7 * 31) as u8).collect();
        let z = compress_to_vec(&raw[..], CompressionLevel::Fastest);
        assert!(is_zstd(&z));
        assert_eq!(decode(&z).unwrap(), raw);
        let two = [z.clone(), z.clone()].concat();
        assert_eq!(decode(&two).unwrap(), [raw.clone(), raw].concat());
    }

    #[test]
    fn refuses_what_is_not_a_stream() {
        let raw = b"some bytes that repeat, some bytes that repeat".repeat(100);
        let z = compress_to_vec(&raw[..], CompressionLevel::Fastest);
        assert_eq!(decode(b"").unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert!(decode(b"not zstd at all").is_err());
        assert!(decode(&z[..z.len() / 2]).is_err(), "cut short");
        let trailing = [&z[..], b"junk"].concat();
        assert!(decode(&trailing).is_err(), "trailing junk");
        let mut flipped = z.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x55;
        match decode(&flipped) {
            Err(_) => {}
            Ok(out) => assert_ne!(out, raw, "a flipped byte decodes to other bytes"),
        }
    }
}
