//! The certificate's time left, and the last renewal in the journal.
use std::path::Path;

use time::OffsetDateTime;

use super::{Check, CERTIFICATE, LAST_RENEWAL};
use crate::identity::JOURNAL_FILE;
use crate::journal::{Entry, Journal, Kind};
use crate::out::human;
use crate::pki::rfc3339;
use crate::pki::GRACE;

/// ok while more than a quarter of the lifetime is left; warn below; fail
/// once expired, with what brings the node back.
pub(super) fn certificate(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
) -> Check {
    if now >= not_after {
        let ago = now - not_after;
        if ago <= GRACE {
            return Check::fail(
                CERTIFICATE,
                format!("expired {} ({} ago)", rfc3339(not_after), human(ago)),
                format!(
                    "within 7 days of expiry bcd node re-joins with x509pop by itself: start bcd node before {}",
                    rfc3339(not_after + GRACE)
                ),
            );
        }
        return Check::fail(
            CERTIFICATE,
            format!(
                "expired {} ({} ago), past the 7 days in which bcd node re-joins with x509pop",
                rfc3339(not_after),
                human(ago)
            ),
            "join again: bcd join --reset --yes, then bcd join",
        );
    }
    if now < not_before {
        return Check::warn(
            CERTIFICATE,
            format!(
                "not valid before {} ({} from now)",
                rfc3339(not_before),
                human(not_before - now)
            ),
            "this host's clock is behind: see the clock check; fix NTP",
        );
    }
    let left = not_after - now;
    let lifetime = not_after - not_before;
    if left.whole_seconds().saturating_mul(4) < lifetime.whole_seconds() {
        return Check::warn(
            CERTIFICATE,
            format!(
                "expires {} ({} left, less than a quarter of its {} lifetime)",
                rfc3339(not_after),
                human(left),
                human(lifetime)
            ),
            "bcd node renews at half the lifetime: is it running? see the last renewal check and its log",
        );
    }
    Check::ok(
        CERTIFICATE,
        format!("expires {} ({} left)", rfc3339(not_after), human(left)),
    )
}

/// The last renewal attempt recorded in `journal.db`. A data directory
/// without a journal is not given one: doctor writes nothing.
pub(super) fn last_renewal(dir: &Path, now: OffsetDateTime) -> Check {
    if !dir.join(JOURNAL_FILE).exists() {
        return Check::ok(LAST_RENEWAL, format!("none yet (no {JOURNAL_FILE})"));
    }
    match Journal::open(dir).and_then(|j| j.last_renewal()) {
        Ok(last) => renewal(last.as_ref(), now),
        Err(e) => Check::warn(
            LAST_RENEWAL,
            format!("cannot read the journal: {e}"),
            "run bcd doctor as the user that runs bcd node (or as root)",
        ),
    }
}

pub(super) fn renewal(last: Option<&Entry>, now: OffsetDateTime) -> Check {
    let Some(e) = last else {
        return Check::ok(LAST_RENEWAL, "none yet");
    };
    let when = format!("{} ({} ago)", rfc3339(e.at), human(now - e.at));
    match e.kind {
        Kind::RenewalFailed if boot_refusal(&e.detail).is_some() => {
            let reason = boot_refusal(&e.detail).unwrap_or_default();
            Check::fail(
                LAST_RENEWAL,
                format!(
                    "refused {when} for this machine's boot ({reason}): {}",
                    e.detail
                ),
                "this node stops renewing until it boots what its pool's boot policy allows: reboot into an allowed boot, or have the operator allow this one (bc-controlplane pools update --boot-policy); security.renew.refused on the control plane names the event",
            )
        }
        Kind::RenewalFailed => Check::warn(
            LAST_RENEWAL,
            format!("the last attempt failed {when}: {}", e.detail),
            "bcd node retries with backoff (30 s to 10 min); if it keeps failing, see the control plane and clock checks and bcd node's log",
        ),
        _ => {
            let detail = if e.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", e.detail)
            };
            Check::ok(LAST_RENEWAL, format!("succeeded {when}{detail}"))
        }
    }
}

/// The reason of a renewal refused for the machine's boot, from the
/// journal's words for it (the control plane's message, which names it
/// right after [`bc_wire::tpm::RENEW_REFUSED_BOOT`]).
fn boot_refusal(detail: &str) -> Option<&str> {
    let at = detail.find(bc_wire::tpm::RENEW_REFUSED_BOOT)?;
    let rest = detail[at + bc_wire::tpm::RENEW_REFUSED_BOOT.len()..].strip_prefix(": ")?;
    let reason = rest.split(':').next()?.trim();
    (!reason.is_empty()).then_some(reason)
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
    }

    const H: i64 = 3600;

    #[test]
    fn time_left_against_the_lifetime() {
        let (nb, na) = (t(0), t(24 * H));
        let ok = certificate(nb, na, t(H));
        assert_eq!(ok.status, Status::Ok);
        assert_eq!(
            ok.line(),
            format!("ok    certificate: expires {} (23h0m left)", rfc3339(na))
        );
        assert_eq!(certificate(nb, na, t(17 * H)).status, Status::Ok);
        let w = certificate(nb, na, t(19 * H));
        assert_eq!(w.status, Status::Warn);
        assert!(w
            .message
            .contains("5h0m left, less than a quarter of its 1d0h lifetime"));
        assert_eq!(certificate(nb, na, t(-60)).status, Status::Warn);
    }

    #[test]
    fn expired_within_and_past_the_grace() {
        let (nb, na) = (t(0), t(24 * H));
        let f = certificate(nb, na, t(25 * H));
        assert_eq!(f.status, Status::Fail);
        assert_eq!(f.message, format!("expired {} (1h0m ago)", rfc3339(na)));
        assert!(f
            .hint
            .as_deref()
            .unwrap()
            .starts_with("within 7 days of expiry bcd node re-joins with x509pop by itself"));
        let f = certificate(nb, na, t(24 * H + 8 * 24 * H));
        assert_eq!(f.status, Status::Fail);
        assert_eq!(
            f.hint.as_deref(),
            Some("join again: bcd join --reset --yes, then bcd join")
        );
    }

    #[test]
    fn the_last_renewal() {
        let now = t(10 * H);
        assert_eq!(renewal(None, now).status, Status::Ok);
        let ok = Entry {
            at: t(9 * H),
            kind: Kind::Renewal,
            node_id: "node_a".into(),
            detail: "renewed".into(),
            not_after: None,
        };
        assert_eq!(
            renewal(Some(&ok), now).message,
            format!("succeeded {} (1h0m ago): renewed", rfc3339(t(9 * H)))
        );
        let failed = Entry {
            kind: Kind::RenewalFailed,
            detail: "cannot reach the control plane".into(),
            ..ok
        };
        let w = renewal(Some(&failed), now);
        assert_eq!(w.status, Status::Warn);
        assert!(w.message.starts_with("the last attempt failed"));
        assert!(w.message.ends_with(": cannot reach the control plane"));
        let boot = Entry {
            detail: format!(
                "renewal refused by the control plane, access denied: {}: boot-app: boot application x with digest ab is allowed by no boot_app entry: boot what …",
                bc_wire::tpm::RENEW_REFUSED_BOOT
            ),
            ..failed
        };
        let f = renewal(Some(&boot), now);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message.contains("for this machine's boot (boot-app)"),
            "{}",
            f.message
        );
        assert!(f.hint.unwrap_or_default().contains("boot policy"));
    }

    #[test]
    fn no_journal_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last_renewal(dir.path(), t(0)).status, Status::Ok);
        assert!(!dir.path().join(JOURNAL_FILE).exists());
        let mut j = Journal::open(dir.path()).unwrap();
        j.record(&Entry {
            at: t(0),
            kind: Kind::RenewalFailed,
            node_id: "node_a".into(),
            detail: "boom".into(),
            not_after: None,
        })
        .unwrap();
        assert_eq!(last_renewal(dir.path(), t(60)).status, Status::Warn);
    }
}
