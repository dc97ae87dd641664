//! What `GET /boot.ipxe` answers, without sockets: the query read and
//! checked, the assertion built, and the iPXE scripts rendered from
//! `ramdisk/boot.ipxe.in` and `ramdisk/exit.ipxe.in`.

use bc_wire::site::ASSERTION_MAX_AGE_MS;
use bc_wire::site_v1::DiscoveryAssertion;

const BOOT_TEMPLATE: &str = include_str!("../../ramdisk/boot.ipxe.in");
const EXIT_TEMPLATE: &str = include_str!("../../ramdisk/exit.ipxe.in");

/// The longest query read: iPXE sends a MAC, a UUID and maybe an IP.
pub(crate) const MAX_QUERY: usize = 512;

/// What iPXE says about the machine (`?mac=${net0/mac}&uuid=${uuid}`).
/// Other keys (an `ip=` among them: the asserted IP is the connection's
/// peer) are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootQuery {
    /// `aa:bb:cc:dd:ee:ff`, lowercase.
    pub mac: String,
    /// Lowercase 8-4-4-4-12; None when absent or not a UUID (iPXE prints
    /// nothing for a machine without SMBIOS).
    pub uuid: Option<String>,
}

/// Why a query is unusable; said on the machine's console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the request has no mac= (use ?mac=${{net0/mac}})")]
    NoMac,
    #[error("mac= is not a MAC address")]
    BadMac,
    #[error("the query is longer than {MAX_QUERY} bytes")]
    TooLong,
}

/// Reads `mac` and `uuid` from a query string (percent-decoded; other keys
/// ignored).
pub fn parse_query(query: &str) -> Result<BootQuery, QueryError> {
    if query.len() > MAX_QUERY {
        return Err(QueryError::TooLong);
    }
    let (mut mac, mut uuid) = (None, None);
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value);
        match key {
            "mac" => mac = Some(value.ok_or(QueryError::BadMac)?),
            "uuid" => uuid = value.and_then(|v| normalize_uuid(&v)),
            _ => {}
        }
    }
    let mac = normalize_mac(&mac.ok_or(QueryError::NoMac)?).ok_or(QueryError::BadMac)?;
    Ok(BootQuery { mac, uuid })
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn normalize_mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| parts.join(":").to_ascii_lowercase())
}

fn normalize_uuid(s: &str) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    let groups: Vec<&str> = lower.split('-').collect();
    let lens = groups.iter().map(|g| g.len()).collect::<Vec<_>>();
    let ok = lens == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then_some(lower)
}

/// How long an assertion is valid at most: the spec's 15 minutes.
pub(crate) const ASSERTION_TTL_MS: i64 = ASSERTION_MAX_AGE_MS;

/// What the site vouches for: the machine it is serving now.
pub(crate) struct Vouch<'a> {
    pub site_id: &'a str,
    pub node_id: &'a str,
    pub epoch: u64,
    /// The MAC iPXE asked for (its boot entry's).
    pub mac: &'a str,
    /// The boot entry's, else iPXE's, else none.
    pub product_uuid: Option<&'a str>,
    /// The connection's peer.
    pub ip: std::net::IpAddr,
    pub workflow_id: &'a str,
    pub entry_not_after_ms: i64,
    pub now_ms: i64,
}

/// The assertion: issued now, valid 15 minutes, never past the boot entry.
pub(crate) fn assertion(v: &Vouch<'_>) -> DiscoveryAssertion {
    DiscoveryAssertion {
        site_id: v.site_id.to_owned(),
        node_id: v.node_id.to_owned(),
        lease_epoch: v.epoch,
        mac: v.mac.to_owned(),
        ip: v.ip.to_string(),
        product_uuid: v.product_uuid.unwrap_or_default().to_owned(),
        workflow_id: v.workflow_id.to_owned(),
        issued_at_unix_ms: v.now_ms,
        not_after_unix_ms: v
            .now_ms
            .saturating_add(ASSERTION_TTL_MS)
            .min(v.entry_not_after_ms),
    }
}

/// The script that boots the ramdisk. `token` and `assertion` are
/// `tok_<id>.<secret>` and base64url: nothing iPXE would expand.
pub(crate) fn boot_script(base: &str, token: &str, assertion: &str, now_unix_s: i64) -> String {
    BOOT_TEMPLATE
        .replace("@BASE@", base)
        .replace("@TOKEN@", token)
        .replace("@ASSERTION@", assertion)
        .replace("@NOW@", &now_unix_s.to_string())
}

/// The script that says why not and exits. `reason` is bcd's own text.
pub fn exit_script(reason: &str) -> String {
    // `$` would be expanded by iPXE, a newline would end the echo.
    let safe: String = reason
        .chars()
        .map(|c| if c == '$' || c.is_control() { ' ' } else { c })
        .collect();
    EXIT_TEMPLATE.replace("@REASON@", &safe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipxe_queries_are_read_and_normalized() {
        let q = parse_query(
            "mac=52%3A54%3A00%3AAB%3Acd%3Aef&uuid=4C4C4544-0042-3510-8052-B4C04F4E4D32",
        )
        .unwrap();
        assert_eq!(q.mac, "52:54:00:ab:cd:ef");
        assert_eq!(
            q.uuid.as_deref(),
            Some("4c4c4544-0042-3510-8052-b4c04f4e4d32")
        );
        assert_eq!(
            parse_query("mac=52:54:00:ab:cd:ef&uuid=").unwrap().uuid,
            None
        );
        assert_eq!(parse_query("uuid=x"), Err(QueryError::NoMac));
        assert_eq!(parse_query("mac=52:54:00"), Err(QueryError::BadMac));
        assert_eq!(parse_query("mac=%zz"), Err(QueryError::BadMac));
        assert_eq!(parse_query(&"a".repeat(600)), Err(QueryError::TooLong));
    }

    #[test]
    fn an_assertion_never_outlives_its_boot_entry() {
        let query = parse_query("mac=52:54:00:ab:cd:ef&ip=10.9.9.9").unwrap();
        let mut v = Vouch {
            site_id: "site_1",
            node_id: "n",
            epoch: 3,
            mac: &query.mac,
            product_uuid: None,
            ip: "10.0.2.15".parse().unwrap(),
            workflow_id: "wf_1",
            entry_not_after_ms: 1_000_000_000,
            now_ms: 1_000,
        };
        assert_eq!(assertion(&v).not_after_unix_ms, 1_000 + 15 * 60_000);
        v.entry_not_after_ms = 5_000;
        assert_eq!(assertion(&v).not_after_unix_ms, 5_000);
    }

    #[test]
    fn exit_scripts_expand_nothing() {
        let s = exit_script("no entry for ${net0/mac}\nshell");
        assert!(
            s.contains("echo bc-site: no entry for  {net0/mac} shell\n"),
            "{s}"
        );
    }
}
