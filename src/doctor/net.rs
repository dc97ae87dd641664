//! The control plane: reachable over HTTPS under the pinned CA, and this
//! host's clock against its HTTP `Date`.
//!
//! Any HTTP answer proves the TLS handshake under `pins.server_ca` and a
//! server behind it: doctor GETs `/`, which the control plane answers with
//! a protobuf NOT_FOUND without touching its database or its event log.
use std::time::Duration;

use time::OffsetDateTime;

use super::{Check, CLOCK, CONTROL_PLANE};
use crate::client::{causes, https_client, io_words, pinned_tls};
use crate::config::Config;
use crate::pki::printable;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Skew above this is worth a look.
const WARN_SKEW_SECS: i64 = 10;
/// x509pop refuses a proof whose client time is further than this from the
/// control plane's.
const FAIL_SKEW_SECS: i64 = 60;

/// The `control plane` and `clock` checks.
pub(super) fn checks(config: &Config) -> Vec<Check> {
    let url = config.api.as_str().trim_end_matches('/').to_owned();
    let probe = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(probe(config)),
        Err(e) => Err(Failure::Setup(format!(
            "cannot start the async runtime: {e}"
        ))),
    };
    match probe {
        Ok(answer) => {
            let reached = Check::ok(
                CONTROL_PLANE,
                format!(
                    "{url} answers over TLS under the pinned CA (HTTP {})",
                    answer.status
                ),
            );
            let local = answer.sent + (answer.received - answer.sent) / 2;
            vec![reached, clock(answer.date.as_deref(), local)]
        }
        Err(f) => vec![
            unreachable(&f, &url),
            Check::skip(CLOCK, "the control plane is unreachable"),
        ],
    }
}

struct Answer {
    status: u16,
    date: Option<String>,
    sent: OffsetDateTime,
    received: OffsetDateTime,
}

enum Failure {
    Setup(String),
    Tls(String),
    Timeout,
    Unreachable(String),
}

async fn probe(config: &Config) -> Result<Answer, Failure> {
    let tls = pinned_tls(config)
        .map_err(Failure::Setup)?
        .with_no_client_auth();
    let http = https_client(
        tls,
        CONNECT_TIMEOUT,
        REQUEST_TIMEOUT,
        concat!("bcd/", env!("CARGO_PKG_VERSION"), " doctor"),
    )
    .map_err(Failure::Setup)?;
    // bcd's own idea of now: the clock every certificate check uses.
    let sent = crate::clock::now();
    let resp = http
        .get(config.api.clone())
        .send()
        .await
        .map_err(|e| classify(&e))?;
    let received = crate::clock::now();
    let date = resp
        .headers()
        .get(reqwest::header::DATE)
        .map(|v| printable(&String::from_utf8_lossy(v.as_bytes())));
    Ok(Answer {
        status: resp.status().as_u16(),
        date,
        sent,
        received,
    })
}

fn unreachable(f: &Failure, url: &str) -> Check {
    let host = url.strip_prefix("https://").unwrap_or(url);
    match f {
        Failure::Setup(m) => Check::fail(
            CONTROL_PLANE,
            format!("cannot set up the HTTPS client: {m}"),
            "check pins.server_ca in the config",
        ),
        Failure::Tls(cause) => Check::fail(
            CONTROL_PLANE,
            format!("TLS with {url} failed: {cause}"),
            "pins.server_ca must be the control plane's CA: take the pins from bc-controlplane agent-config, and check that api names that control plane",
        ),
        Failure::Timeout => Check::fail(
            CONTROL_PLANE,
            format!(
                "{url} did not answer (connect timeout {} s, answer timeout {} s)",
                CONNECT_TIMEOUT.as_secs(),
                REQUEST_TIMEOUT.as_secs()
            ),
            format!("check the network path to {host} (firewall, routes, proxy) and that the control plane runs"),
        ),
        Failure::Unreachable(cause) => Check::fail(
            CONTROL_PLANE,
            format!("cannot reach {url}: {cause}"),
            format!("check that the control plane runs and listens at {host}, that api in the config is its address, and DNS and firewall on the way"),
        ),
    }
}

/// This host's clock against the control plane's `Date` (whole seconds;
/// `local` is the middle of the request). The system clock on both sides:
/// a test build's moved clock moves the control plane's database time, not
/// its `Date`.
pub(super) fn clock(date: Option<&str>, local: OffsetDateTime) -> Check {
    let Some(date) = date else {
        return Check::warn(
            CLOCK,
            "the control plane sent no Date header: skew unknown",
            "x509pop allows 60 s: check that NTP runs (timedatectl)",
        );
    };
    let Some(server) = parse_http_date(date) else {
        return Check::warn(
            CLOCK,
            format!("the control plane's Date header {date:?} is not an HTTP date: skew unknown"),
            "x509pop allows 60 s: check that NTP runs (timedatectl)",
        );
    };
    // The header truncates to the second: the server's time lies within
    // [date, date + 1 s); compare with the middle.
    let skew = (server + time::Duration::milliseconds(500) - local).whole_seconds();
    let abs = skew.abs();
    let relation = if skew > 0 {
        format!("{abs} s behind the control plane's")
    } else {
        format!("{abs} s ahead of the control plane's")
    };
    if abs > FAIL_SKEW_SECS {
        Check::fail(
            CLOCK,
            format!("this host's clock is {relation}"),
            "x509pop allows 60 s; fix NTP",
        )
    } else if abs > WARN_SKEW_SECS {
        Check::warn(
            CLOCK,
            format!("this host's clock is {relation}"),
            "x509pop allows 60 s; check NTP (timedatectl, chronyc tracking)",
        )
    } else {
        Check::ok(
            CLOCK,
            format!("within {} s of the control plane's", abs.max(1)),
        )
    }
}

/// An HTTP date in the one format servers send (RFC 9110's IMF-fixdate):
/// `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(super) fn parse_http_date(s: &str) -> Option<OffsetDateTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(s.trim(), format)
        .ok()
        .map(|t| t.assume_utc())
}

/// TLS refusal, timeout, or anything else (with its innermost cause).
fn classify(e: &reqwest::Error) -> Failure {
    if e.is_timeout() {
        return Failure::Timeout;
    }
    let chain = causes(e);
    if let Some(tls) = chain.iter().find_map(|c| c.downcast_ref::<rustls::Error>()) {
        return Failure::Tls(tls.to_string());
    }
    match io_words(&chain) {
        Some((std::io::ErrorKind::TimedOut, _)) => return Failure::Timeout,
        Some((_, words)) => return Failure::Unreachable(words.to_owned()),
        None => {}
    }
    let last = chain
        .last()
        .map_or_else(|| e.to_string(), |c| c.to_string());
    Failure::Unreachable(printable(&last))
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    #[test]
    fn parses_imf_fixdate_only() {
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t.unix_timestamp(), 784_111_777);
        assert!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT").is_none());
        assert!(parse_http_date("1994-11-06T08:49:37Z").is_none());
        assert!(parse_http_date("").is_none());
    }

    #[test]
    fn classifies_the_skew() {
        let server = "Sun, 06 Nov 1994 08:49:37 GMT";
        let at = |offset_ms: i64| {
            parse_http_date(server).unwrap() + time::Duration::milliseconds(offset_ms)
        };
        let ok = clock(Some(server), at(300));
        assert_eq!(ok.status, Status::Ok);
        assert_eq!(ok.message, "within 1 s of the control plane's");
        let ok = clock(Some(server), at(-9_000));
        assert_eq!(ok.status, Status::Ok, "{}", ok.line());
        // This host 25 s ahead.
        let w = clock(Some(server), at(25_500));
        assert_eq!(w.status, Status::Warn);
        assert_eq!(
            w.message,
            "this host's clock is 25 s ahead of the control plane's"
        );
        // This host 90 s behind.
        let f = clock(Some(server), at(-89_500));
        assert_eq!(f.status, Status::Fail);
        assert_eq!(
            f.line(),
            "fail  clock: this host's clock is 90 s behind the control plane's; x509pop allows 60 s; fix NTP"
        );
        assert_eq!(clock(Some(server), at(61_600)).status, Status::Fail);
        assert_eq!(clock(None, at(0)).status, Status::Warn);
        assert_eq!(clock(Some("yesterday"), at(0)).status, Status::Warn);
    }
}
