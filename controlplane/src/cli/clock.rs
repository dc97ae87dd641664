//! `clock set|show`: the offset of the database clock, which every expiry
//! check and certificate validity uses (tests move it instead of waiting).

use anyhow::{Context, Result};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::store;
use clap::Subcommand;

use super::{open_db, print_line, Dir};

#[derive(Subcommand)]
pub(crate) enum ClockCmd {
    /// Set the database clock to system time plus OFFSET.
    Set {
        #[command(flatten)]
        dir: Dir,
        /// A signed duration: -1h, +25h, 0s, 90m, 7d.
        #[arg(long, allow_hyphen_values = true, value_parser = parse_duration_ms)]
        offset: i64,
    },
    /// Print the clock offset and the database's time.
    Show {
        #[command(flatten)]
        dir: Dir,
    },
}

pub(crate) fn run(cmd: ClockCmd) -> Result<()> {
    let (offset, now) = match cmd {
        ClockCmd::Set { dir, offset } => {
            let db = open_db(&dir.dir)?;
            let now = db
                .write(|tx| {
                    store::set_clock_offset_ms(tx, offset)?;
                    tx.now()
                })
                .context("cannot set the clock")?;
            (offset, now)
        }
        ClockCmd::Show { dir } => {
            let db = open_db(&dir.dir)?;
            db.read(|tx| Ok::<_, store::DbError>((store::clock_offset_ms(tx)?, tx.now()?)))
                .context("cannot read the clock")?
        }
    };
    print_line(&format!(
        "clock offset {} (database time {})",
        format_offset(offset),
        store::rfc3339(now)
    ))
}

/// An offset in the largest unit that divides it exactly.
fn format_offset(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "+" };
    let abs = ms.unsigned_abs();
    if abs == 0 {
        return "+0s".to_owned();
    }
    for (unit, len) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if abs % len == 0 {
            return format!("{sign}{}{unit}", abs / len);
        }
    }
    format!("{sign}{abs}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_signed() {
        assert_eq!(parse_duration_ms("-1h"), Ok(-3_600_000));
        assert_eq!(parse_duration_ms("+25h"), Ok(90_000_000));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
        assert!(parse_duration_ms("-").is_err());
        assert!(parse_duration_ms("--1h").is_err());
    }

    #[test]
    fn offsets_print_back() {
        assert_eq!(format_offset(0), "+0s");
        assert_eq!(format_offset(-3_600_000), "-1h");
        assert_eq!(format_offset(90_000_000), "+25h");
        assert_eq!(format_offset(1_500), "+1500ms");
    }
}
