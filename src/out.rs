//! Writing the CLI's answers.
//!
//! `println!` panics when stdout is gone (a closed pipe: `bcd status | head -0`);
//! bcd fails with a message instead, like on any other I/O error.
use std::fmt;
use std::io::Write as _;

use anyhow::Context as _;

/// One line on stdout.
pub(crate) fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{args}")
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}

/// One line on stderr; a failure to write it has nowhere to be reported.
pub(crate) fn err_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// `23h59m`, `2d3h`, `5m`, `12s`: coarse enough to read at a glance.
pub(crate) fn human(d: time::Duration) -> String {
    let s = d.whole_seconds().max(0);
    let (days, hours, mins) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{mins}m")
    } else if mins > 0 {
        format!("{mins}m")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(
            human(time::Duration::seconds(23 * 3600 + 59 * 60 + 30)),
            "23h59m"
        );
        assert_eq!(
            human(time::Duration::seconds(2 * 86_400 + 3 * 3600)),
            "2d3h"
        );
        assert_eq!(human(time::Duration::seconds(300)), "5m");
        assert_eq!(human(time::Duration::seconds(12)), "12s");
    }
}
