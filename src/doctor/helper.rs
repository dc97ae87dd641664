//! Under `[helper]`: the `tpm` check is about who may open the TPM (the
//! node's user must not: not in the `tss` group), and the `helper` check
//! asks bcd helper for its AK, which shows that it is reachable, that it
//! serves the user running this, and which TPM it holds.
use super::{Check, EK_CERTIFICATE, HELPER, TPM};
use crate::config::HelperSettings;

/// The group that may open /dev/tpmrm0 on Debian (udev rules of tpm2-tss).
const TSS_GROUP: &str = "tss";

/// The `tpm`, `ek certificate` and `helper` checks under `[helper]`.
pub(super) fn checks(settings: &HelperSettings, client: Option<&bc_helper::Client>) -> Vec<Check> {
    let in_tss = user_in_group(&settings.user, TSS_GROUP);
    let mut checks = vec![tss_check(&settings.user, in_tss)];
    checks.push(Check::skip(
        EK_CERTIFICATE,
        "under [helper] bcd node does not open the TPM; as root: bcd tpm identify",
    ));
    let uid = crate::identity::guard::effective_uid();
    checks.push(match client {
        None => Check::fail(HELPER, "no client", "report this"),
        Some(c) => helper_check(settings, uid, c.ak().map(|ak| ak.tpm)),
    });
    checks
}

/// Fails while `user` is in the `tss` group (`in_tss`: `None` when the
/// group does not exist).
pub(super) fn tss_check(user: &str, in_tss: Option<bool>) -> Check {
    match in_tss {
        Some(true) => Check::fail(
            TPM,
            format!("the node's user {user} is in the {TSS_GROUP} group, so it can open the TPM itself (and clear it, change its authorizations or trip its lockout)"),
            format!("take it out: gpasswd -d {user} {TSS_GROUP}, then restart bcd node"),
        ),
        _ => Check::ok(
            TPM,
            format!("held by bcd helper; the node's user {user} cannot open it (not in the {TSS_GROUP} group)"),
        ),
    }
}

/// What asking the helper for its AK (`answer`) says, for a caller of `uid`.
pub(super) fn helper_check(
    settings: &HelperSettings,
    uid: Option<u32>,
    answer: Result<String, bc_helper::ClientError>,
) -> Check {
    let socket = settings.socket.display();
    let who = uid.map_or("this user".to_owned(), |u| format!("uid {u}"));
    match answer {
        Ok(tpm) => Check::ok(
            HELPER,
            format!("bcd helper at {socket} serves {who}; its TPM: {tpm}"),
        ),
        Err(e @ bc_helper::ClientError::Connect { .. }) => Check::fail(
            HELPER,
            e.to_string(),
            "start it: systemctl start bcd-helper.socket (or run bcd helper as root)",
        ),
        Err(e @ bc_helper::ClientError::Closed) => Check::fail(
            HELPER,
            format!("{e}: it does not serve {who}"),
            format!(
                "run bcd node and bcd doctor as [helper] user {}",
                settings.user
            ),
        ),
        Err(bc_helper::ClientError::Helper(m)) if m == bc_helper::TOO_MANY => Check::fail(
            HELPER,
            format!("bcd helper at {socket} has too many connections open"),
            "see bcd helper's log for the uid holding them; root keeps a few in reserve",
        ),
        Err(e) => Check::fail(HELPER, e.to_string(), "see bcd helper's log"),
    }
}

/// Whether `user` is in `group` (as a member or by its primary group);
/// `None` when the group does not exist.
fn user_in_group(user: &str, group: &str) -> Option<bool> {
    let g = nix::unistd::Group::from_name(group).ok()??;
    if g.mem.iter().any(|m| m == user) {
        return Some(true);
    }
    let primary = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .is_some_and(|u| u.gid == g.gid);
    Some(primary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tpm_check_fails_while_the_node_user_is_in_tss() {
        let c = tss_check("bcd", Some(true));
        assert_eq!(c.status, super::super::Status::Fail);
        assert!(c.line().contains("gpasswd -d bcd tss"), "{}", c.line());
        assert_eq!(
            tss_check("bcd", Some(false)).status,
            super::super::Status::Ok
        );
        assert_eq!(tss_check("bcd", None).status, super::super::Status::Ok);
    }

    #[test]
    fn the_helper_check_names_what_to_do() {
        let s = HelperSettings::default();
        let ok = helper_check(&s, Some(7), Ok("device:/dev/tpmrm0 (IBM SW TPM)".into()));
        assert_eq!(
            ok.line(),
            "ok    helper: bcd helper at /run/bcd/helper.sock serves uid 7; its TPM: device:/dev/tpmrm0 (IBM SW TPM)"
        );
        let refused = helper_check(&s, Some(7), Err(bc_helper::ClientError::Closed));
        assert!(
            refused.line().contains("does not serve uid 7"),
            "{}",
            refused.line()
        );
        assert!(refused
            .line()
            .ends_with("run bcd node and bcd doctor as [helper] user bcd"));
    }
}
