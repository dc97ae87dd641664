//! The one source of "now" for every decision bcd takes about time: when to
//! renew, whether a certificate expired, how long its grace lasts, the
//! x509pop client time, journal entries.
//!
//! Production builds read the system clock and nothing else. Builds with the
//! `failpoints` feature (the end-to-end tests) add `BCD_CLOCK_OFFSET`, a
//! signed duration such as `+25h` or `-2m`, so that a test reproduces a day
//! or a week in seconds by moving bcd's clock together with the control
//! plane's database clock.
use time::OffsetDateTime;

/// The environment variable a `failpoints` build adds to the system clock.
#[cfg(feature = "failpoints")]
const OFFSET_ENV: &str = "BCD_CLOCK_OFFSET";

/// Now, in UTC.
pub(crate) fn now() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    #[cfg(feature = "failpoints")]
    {
        // An env-fed offset past year 9999 must not panic: it is ignored.
        now.checked_add(test_offset()).unwrap_or(now)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        now
    }
}

/// Now, to the second: what files and the journal keep.
pub(crate) fn now_seconds() -> OffsetDateTime {
    let now = now();
    now.replace_nanosecond(0).unwrap_or(now)
}

/// Unix milliseconds (0 before 1970, which no honest clock shows).
pub(crate) fn unix_ms(t: OffsetDateTime) -> u64 {
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

/// `BCD_CLOCK_OFFSET`, read once. A value that does not parse is reported
/// and ignored: a test that meant to move the clock then fails visibly.
#[cfg(feature = "failpoints")]
fn test_offset() -> time::Duration {
    use std::sync::OnceLock;
    static OFFSET: OnceLock<time::Duration> = OnceLock::new();
    *OFFSET.get_or_init(|| match std::env::var(OFFSET_ENV) {
        Err(_) => time::Duration::ZERO,
        Ok(v) => match parse_offset(&v) {
            Ok(d) => {
                tracing::warn!(offset = %v, "test build: the clock is moved by {OFFSET_ENV}");
                d
            }
            Err(e) => {
                tracing::warn!(error = %e, "test build: {OFFSET_ENV} ignored");
                time::Duration::ZERO
            }
        },
    })
}

/// `+25h`, `-2m`, `90s`, `+7d`, `0`: an optional sign, a whole number and
/// one unit (s, m, h, d).
#[cfg(any(test, feature = "failpoints"))]
pub(crate) fn parse_offset(s: &str) -> Result<time::Duration, String> {
    let expected = || format!("{s:?}: expected a signed duration like +25h, -2m, 90s or +7d");
    let t = s.trim();
    let (negative, rest) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if rest == "0" {
        return Ok(time::Duration::ZERO);
    }
    let split = rest
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(expected)?;
    let (n, unit) = rest.split_at(split);
    let n: i64 = n.parse().map_err(|_| expected())?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .ok_or_else(expected)?;
    Ok(time::Duration::seconds(if negative { -secs } else { secs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_with_sign_and_unit() {
        assert_eq!(parse_offset("+25h").unwrap(), time::Duration::hours(25));
        assert_eq!(parse_offset("-2m").unwrap(), time::Duration::minutes(-2));
        assert_eq!(parse_offset("90s").unwrap(), time::Duration::seconds(90));
        assert_eq!(parse_offset("+7d").unwrap(), time::Duration::days(7));
        assert_eq!(parse_offset("0").unwrap(), time::Duration::ZERO);
        for bad in [
            "",
            "+",
            "h",
            "25",
            "+25x",
            "--1h",
            "1h2m",
            "+99999999999999999999d",
        ] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unix_ms_is_milliseconds() {
        let t = OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap();
        assert_eq!(unix_ms(t), 1_790_000_000_000);
    }
}
