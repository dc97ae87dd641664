//! `logs.collect`: bcd's own journal (`journal.db`: joins, renewals,
//! re-joins, commands) and, where there is one, the system journal of
//! bcd's units, since a time, bounded in lines and bytes (the newest kept).
//! The system journal is root's: a node under `[helper]` asks `bcd helper`
//! (`system.journal`), a node running as root reads it through the same
//! bounded `journalctl` run, and any other says why it is not available.
use bc_helper::journal::Query;
use bc_wire::command::args::Args;
use bc_wire::command::MAX_OUTPUT;
use time::OffsetDateTime;

use super::{Done, Machine};
use crate::journal::Journal;
use crate::keys::TpmAccess;

/// Without `lines`: the newest thousand.
const DEFAULT_LINES: u64 = 1000;
/// Without `since`: the last day.
const DEFAULT_SINCE: time::Duration = time::Duration::days(1);

pub(super) fn collect(machine: &Machine, args: &Args) -> Done {
    let now = crate::clock::now();
    let since = args
        .number("since")
        .and_then(|ms| i64::try_from(ms).ok())
        .and_then(|ms| OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok())
        .unwrap_or(now - DEFAULT_SINCE);
    let lines = args.number("lines").unwrap_or(DEFAULT_LINES);
    let bytes = args
        .number("bytes")
        .map_or(MAX_OUTPUT, |b| usize::try_from(b).unwrap_or(MAX_OUTPUT))
        .min(MAX_OUTPUT);
    let limit = u32::try_from(lines).unwrap_or(u32::MAX);
    let own =
        match Journal::open_commands(&machine.data_dir).and_then(|j| j.lines_since(since, limit)) {
            Ok(l) => l,
            Err(e) => return Done::failed(format!("cannot read bcd's journal: {e}")),
        };
    let query = Query {
        since_ms: u64::try_from(since.unix_timestamp_nanos() / 1_000_000).unwrap_or(0),
        lines: u32::try_from(lines)
            .unwrap_or(u32::MAX)
            .clamp(1, bc_helper::journal::MAX_LINES),
        bytes: u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, bc_helper::journal::MAX_BYTES),
    };
    let system = system_journal(&machine.tpm, &query);
    let counts = format!(
        "journal.db {} lines, system journal: {}",
        own.len(),
        match &system {
            Ok(l) => format!("{} lines", l.len()),
            Err(why) => format!("not available ({why})"),
        }
    );
    let mut all: Vec<String> = own.into_iter().map(|l| format!("bcd {l}")).collect();
    all.extend(system.unwrap_or_default());
    let text = newest(&all, usize::try_from(lines).unwrap_or(usize::MAX), bytes);
    Done::ok(counts, text.as_bytes())
}

/// The newest of `lines` within `max_lines` and `max_bytes`, whole lines,
/// in order.
fn newest(lines: &[String], max_lines: usize, max_bytes: usize) -> String {
    let mut kept = Vec::new();
    let mut size = 0usize;
    for line in lines.iter().rev().take(max_lines) {
        let n = line.len() + 1;
        if size + n > max_bytes {
            break;
        }
        size += n;
        kept.push(line.as_str());
    }
    kept.reverse();
    let mut text = kept.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text
}

/// The system journal of bcd's units, each line marked `system`: through
/// the helper when this node runs under `[helper]`, directly as root, or
/// why neither can read it.
fn system_journal(tpm: &TpmAccess, query: &Query) -> Result<Vec<String>, String> {
    let text = match tpm {
        TpmAccess::Helper(helper) => helper.journal(query).map_err(|e| e.to_string())?,
        _ if nix::unistd::geteuid().is_root() => bc_helper::journal::read(query)?,
        _ => {
            return Err(
                "bcd runs unprivileged without bcd helper; only root reads the system journal"
                    .into(),
            )
        }
    };
    Ok(text.lines().map(|l| format!("system {l}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_whole_lines_within_both_bounds() {
        let lines: Vec<String> = (0..10).map(|i| format!("line {i}")).collect();
        assert_eq!(newest(&lines, 2, 1000), "line 8\nline 9\n");
        assert_eq!(newest(&lines, 100, 14), "line 8\nline 9\n");
        assert_eq!(newest(&lines, 100, 13), "line 9\n");
        assert_eq!(newest(&lines, 100, 3), "");
    }
}
