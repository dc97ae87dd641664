//! `system.journal`: the system journal of bcd's own units, for
//! `logs.collect`. The journal is root's (or the `systemd-journal`
//! group's), so an unprivileged node asks the helper; a node that runs as
//! root reads it through the same function.
//!
//! What a caller may choose is a time and two bounds; the units, the
//! program and every other argument are fixed here, and `journalctl` runs
//! without a shell, with an empty environment and a time limit. Its output
//! is read as it comes, only the newest whole lines within the bounds kept,
//! each line cut at [`MAX_LINE`] bytes and made printable.
use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The units the package installs (packaging/systemd/): no others are read.
pub const UNITS: &[&str] = &[
    "bcd-node.service",
    "bcd-helper.service",
    "bcd-helper.socket",
    "bcd-site.service",
];

/// The most lines a caller may ask for (`logs.collect`'s own bound).
pub const MAX_LINES: u32 = 100_000;
/// The most bytes a caller may ask for (a command result's output cap).
pub const MAX_BYTES: u32 = 1 << 20;
/// How long `journalctl` may run before it is killed.
pub const TIME_LIMIT: Duration = Duration::from_secs(15);
/// A longer journal line is cut here (marked `…`).
pub const MAX_LINE: usize = 16 * 1024;
/// Where `journalctl` is looked for, in turn: never through `PATH`.
const JOURNALCTL: &[&str] = &["/usr/bin/journalctl", "/bin/journalctl"];
/// How much of `journalctl`'s stderr is kept for an error.
const MAX_STDERR: usize = 4096;

/// What a caller may choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    /// Entries since this time (Unix milliseconds).
    pub since_ms: u64,
    /// At most this many lines, the newest (1..=[`MAX_LINES`]).
    pub lines: u32,
    /// At most this many bytes of text, whole lines (1..=[`MAX_BYTES`]).
    pub bytes: u32,
}

impl Query {
    /// The query, checked against the bounds; the error names what is out.
    pub fn checked(since_ms: u64, lines: u32, bytes: u32) -> Result<Query, &'static str> {
        if !(1..=MAX_LINES).contains(&lines) {
            return Err("journal lines outside 1..=100000");
        }
        if !(1..=MAX_BYTES).contains(&bytes) {
            return Err("journal bytes outside 1..=1048576");
        }
        Ok(Query {
            since_ms,
            lines,
            bytes,
        })
    }

    /// `journalctl`'s arguments (after its path): fixed but for the time
    /// and the line count, both numbers.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = vec![
            "--no-pager".to_owned(),
            "--utc".to_owned(),
            "--output=short-iso".to_owned(),
            format!("--since=@{}", self.since_ms / 1000),
            format!("--lines={}", self.lines),
        ];
        argv.extend(UNITS.iter().map(|u| format!("--unit={u}")));
        argv
    }
}

/// The newest lines of bcd's units since the query's time, within its
/// bounds, each ending in a newline; or why the system journal is not
/// available here (no `journalctl`, no journal files, a failure, the time
/// limit).
pub fn read(query: &Query) -> Result<String, String> {
    let Some(program) = JOURNALCTL.iter().find(|p| std::path::Path::new(p).exists()) else {
        return Err("journalctl is not installed".into());
    };
    let mut child = Command::new(program)
        .args(query.argv())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("journalctl's output cannot be read".into());
    };
    let child = Arc::new(Mutex::new(child));
    let timed_out = Arc::new(AtomicBool::new(false));
    let (finished, finished_rx) = mpsc::channel::<()>();
    let watchdog = {
        let child = child.clone();
        let timed_out = timed_out.clone();
        std::thread::Builder::new()
            .name("journal-limit".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = finished_rx.recv_timeout(TIME_LIMIT) {
                    timed_out.store(true, Ordering::SeqCst);
                    kill(&child);
                }
            })
    };
    let Ok(watchdog) = watchdog else {
        kill(&child);
        return Err("cannot start journalctl's time limit".into());
    };
    let errors = std::thread::Builder::new()
        .name("journal-stderr".into())
        .spawn(move || head(stderr, MAX_STDERR));
    let kept = newest(stdout, query);
    drop(finished);
    let _ = watchdog.join();
    let status = match child.lock() {
        Ok(mut c) => c.wait().map_err(|e| format!("journalctl: {e}")),
        Err(_) => Err("journalctl's watchdog failed".to_owned()),
    };
    let errors = match errors {
        Ok(t) => t.join().unwrap_or_default(),
        Err(_) => String::new(),
    };
    if timed_out.load(Ordering::SeqCst) {
        return Err(format!(
            "journalctl did not finish within {} s",
            TIME_LIMIT.as_secs()
        ));
    }
    let status = status?;
    if errors.contains("No journal files were found") {
        return Err("no journal files on this machine".into());
    }
    if !status.success() {
        let first = errors.lines().next().unwrap_or("").trim();
        return Err(format!("journalctl failed ({status}): {first}"));
    }
    let kept = kept.map_err(|e| format!("cannot read journalctl's output: {e}"))?;
    let mut text = String::with_capacity(query.bytes as usize);
    for line in kept {
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

fn kill(child: &Mutex<Child>) {
    if let Ok(mut c) = child.lock() {
        let _ = c.kill();
    }
}

/// The first `max` bytes of `from`, as text; the rest is read and dropped
/// (so the writer never blocks on a full pipe).
fn head(from: impl Read, max: usize) -> String {
    let mut kept = Vec::new();
    let mut from = BufReader::new(from);
    loop {
        let n = match from.fill_buf() {
            Ok([]) | Err(_) => break,
            Ok(buf) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..buf.len().min(room)]);
                buf.len()
            }
        };
        from.consume(n);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// The newest lines of `from` within the query's bounds, each cut at
/// [`MAX_LINE`] and printable; `journalctl`'s own markers (`-- No entries
/// --`, `-- Boot … --`) left out. Memory stays within the bounds whatever
/// `from` holds.
fn newest(from: impl Read, query: &Query) -> std::io::Result<VecDeque<String>> {
    let mut kept: VecDeque<String> = VecDeque::new();
    let mut size = 0usize;
    let mut line = Vec::new();
    let mut cut = false;
    let mut from = BufReader::new(from);
    loop {
        let buf = from.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let (part, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        let room = MAX_LINE.saturating_sub(line.len());
        cut |= part.len() > room;
        line.extend_from_slice(&part[..part.len().min(room)]);
        let used = end.unwrap_or(buf.len());
        from.consume(used);
        if end.is_some() {
            keep(&mut kept, &mut size, printable(&line, cut), query);
            line.clear();
            cut = false;
        }
    }
    if !line.is_empty() {
        keep(&mut kept, &mut size, printable(&line, cut), query);
    }
    Ok(kept)
}

/// Adds `line` as the newest, dropping the oldest until both bounds hold.
fn keep(kept: &mut VecDeque<String>, size: &mut usize, line: String, query: &Query) {
    if line.is_empty() || (line.starts_with("-- ") && line.ends_with(" --")) {
        return;
    }
    let n = line.len() + 1;
    if n > query.bytes as usize {
        return;
    }
    kept.push_back(line);
    *size += n;
    while kept.len() > query.lines as usize || *size > query.bytes as usize {
        match kept.pop_front() {
            Some(old) => *size -= old.len() + 1,
            None => break,
        }
    }
}

/// `bytes` as one line of text: invalid UTF-8 replaced, control characters
/// (a terminal's escapes) made spaces, a cut line marked.
fn printable(bytes: &[u8], cut: bool) -> String {
    let mut text: String = String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if cut {
        text.push('…');
    }
    text
}

/// Whether `text` is what [`read`] returns for `query`: within both bounds,
/// whole printable lines. The node checks the helper's answer with it.
pub fn within(text: &str, query: &Query) -> bool {
    text.len() <= query.bytes as usize
        && (text.is_empty() || text.ends_with('\n'))
        && text.lines().count() <= query.lines as usize
        && text.lines().all(|l| l.len() <= MAX_LINE + '…'.len_utf8())
        && !text.chars().any(|c| c.is_control() && c != '\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(lines: u32, bytes: u32) -> Query {
        Query::checked(0, lines, bytes).unwrap()
    }

    #[test]
    fn keeps_the_newest_whole_lines_within_both_bounds() {
        let input = (0..10).map(|i| format!("line {i}\n")).collect::<String>();
        let got = |query| Vec::from(newest(input.as_bytes(), &query).unwrap());
        assert_eq!(got(q(2, 1000)), ["line 8", "line 9"]);
        assert_eq!(got(q(100, 14)), ["line 8", "line 9"]);
        assert_eq!(got(q(100, 13)), ["line 9"]);
        assert!(got(q(100, 3)).is_empty());
    }

    #[test]
    fn long_lines_are_cut_and_escapes_made_spaces() {
        let mut input = vec![b'a'; MAX_LINE * 3];
        input.extend_from_slice(b"\nred \x1b[31m\xff\n-- No entries --\nlast");
        let got = newest(input.as_slice(), &q(10, MAX_BYTES)).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].len(), MAX_LINE + '…'.len_utf8());
        assert!(got[0].ends_with('…'));
        assert_eq!(got[1], "red  [31m\u{fffd}");
        assert_eq!(got[2], "last");
        let text = got.iter().map(|l| format!("{l}\n")).collect::<String>();
        assert!(within(&text, &q(10, MAX_BYTES)));
        assert!(!within(&text, &q(2, MAX_BYTES)));
        assert!(!within("a\x1b\n", &q(10, 100)));
    }

    #[test]
    fn the_arguments_are_fixed_but_for_two_numbers() {
        let argv = Query::checked(1_790_000_000_999, 50, 4096).unwrap().argv();
        assert!(argv.contains(&"--since=@1790000000".to_owned()));
        assert!(argv.contains(&"--lines=50".to_owned()));
        let units: Vec<_> = argv.iter().filter(|a| a.starts_with("--unit=")).collect();
        assert_eq!(units.len(), UNITS.len());
        assert_eq!(
            Query::checked(0, 0, 1),
            Err("journal lines outside 1..=100000")
        );
        assert_eq!(
            Query::checked(0, 1, MAX_BYTES + 1),
            Err("journal bytes outside 1..=1048576")
        );
    }
}
