//! Time to parse, replay and extract a log, as the control plane does at
//! every join and renewal: `cargo run --release -p bc-eventlog --example
//! eventlog-bench -- LOG [ITERATIONS]`. Prints the mean per log.

use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: eventlog-bench LOG [ITERATIONS]");
        return ExitCode::from(2);
    };
    let iterations: u32 = match args.next().map(|n| n.parse()) {
        None => 2000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("ITERATIONS must be a positive number");
            return ExitCode::from(2);
        }
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let limits = bc_eventlog::Limits::default();
    let mut events = 0;
    let start = Instant::now();
    for _ in 0..iterations {
        let log = match bc_eventlog::parse(&bytes, &limits) {
            Ok(log) => log,
            Err(e) => {
                eprintln!("{path}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let replay = bc_eventlog::replay(&log, &[]);
        let facts = bc_eventlog::extract(&log, &limits);
        events = log.events.len();
        std::hint::black_box((replay, facts));
    }
    let mean = start.elapsed() / iterations;
    println!(
        "{path}: {events} events, {} bytes: parse + replay + extract {:.1} us (mean of {iterations})",
        bytes.len(),
        mean.as_secs_f64() * 1e6
    );
    ExitCode::SUCCESS
}
