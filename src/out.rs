//! Writing the CLI's answers.
//!
//! `println!` panics when stdout is gone (a closed pipe: `bcd status | head -0`);
//! bcd fails with a message instead, like on any other I/O error.
use std::fmt;
use std::io::Write as _;

use anyhow::Context as _;

/// One line on stdout.
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{args}")
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}

/// One line on stderr; a failure to write it has nowhere to be reported.
pub fn err_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
