//! `[site]`: what `bcd site` serves and where. Parsed with the rest of the
//! configuration (`crate::config`), so a bad value names its line.

use std::net::SocketAddr;
use std::path::PathBuf;

use reqwest::Url;
use serde::Deserialize;
use toml::Spanned;

/// `[site]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSite {
    id: Spanned<String>,
    listen: Spanned<String>,
    public_url: Spanned<String>,
    ramdisk_dir: Spanned<String>,
    ramdisk_api: Spanned<String>,
    #[serde(default)]
    max_connections: Option<Spanned<i64>>,
    #[serde(default)]
    max_connections_per_source: Option<Spanned<i64>>,
}

/// Connections `bcd site` holds at once, by default: a rack PXE-booting at
/// once, each machine with a connection or two.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Connections one source address holds at once, by default: iPXE uses
/// one or two; a neighbour holding sockets open takes these, not the rest.
pub(crate) const DEFAULT_MAX_PER_SOURCE: usize = 8;

/// `[site]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteSettings {
    /// The site this node serves (`bc-controlplane sites create` printed
    /// it; the site token the node joined with named it).
    pub id: String,
    /// Where the plain-HTTP boot server listens (`0.0.0.0:8080`).
    pub listen: SocketAddr,
    /// How machines reach it (`http://10.0.0.5:8080`): the kernel and
    /// initrd URLs of every script are under it. iPXE speaks plain HTTP.
    pub public_url: String,
    /// Holds `vmlinuz` and `initrd` (ramdisk/build's output).
    pub ramdisk_dir: PathBuf,
    /// The control plane's URL as the booted ramdisk reaches it.
    pub ramdisk_api: Url,
    /// `max_connections`: connections held at once (see `bcd site`'s `http` module).
    pub max_connections: usize,
    /// `max_connections_per_source`: of those, from one address (an IPv6
    /// source by its /64); never more than `max_connections`.
    pub max_per_source: usize,
}

impl RawSite {
    /// Checks every field; the error is the span of the bad value and the
    /// message.
    pub(crate) fn check(
        &self,
        parse_api: impl Fn(&str) -> Result<Url, String>,
    ) -> Result<SiteSettings, (std::ops::Range<usize>, String)> {
        let id = self.id.get_ref();
        if id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err((
                self.id.span(),
                format!("site.id: expected a site id (site_...), got {id:?}"),
            ));
        }
        let listen = self.listen.get_ref().parse::<SocketAddr>().map_err(|_| {
            (
                self.listen.span(),
                format!(
                    "site.listen: expected ADDRESS:PORT, got {:?}",
                    self.listen.get_ref()
                ),
            )
        })?;
        let public_url = check_public_url(self.public_url.get_ref())
            .map_err(|m| (self.public_url.span(), format!("site.public_url: {m}")))?;
        let dir = PathBuf::from(self.ramdisk_dir.get_ref());
        if !dir.is_absolute() {
            return Err((
                self.ramdisk_dir.span(),
                format!(
                    "site.ramdisk_dir: expected an absolute path, got {:?}",
                    self.ramdisk_dir.get_ref()
                ),
            ));
        }
        let ramdisk_api = parse_api(self.ramdisk_api.get_ref())
            .map_err(|m| (self.ramdisk_api.span(), format!("site.ramdisk_api: {m}")))?;
        let cap = |v: &Option<Spanned<i64>>, name: &str, default: usize| match v {
            None => Ok(default),
            Some(v) => usize::try_from(*v.get_ref())
                .ok()
                .filter(|n| (1..=65_536).contains(n))
                .ok_or_else(|| {
                    (
                        v.span(),
                        format!(
                            "site.{name}: expected a number of connections from 1 to 65536, got {}",
                            v.get_ref()
                        ),
                    )
                }),
        };
        let max_connections = cap(
            &self.max_connections,
            "max_connections",
            DEFAULT_MAX_CONNECTIONS,
        )?;
        let max_per_source = cap(
            &self.max_connections_per_source,
            "max_connections_per_source",
            DEFAULT_MAX_PER_SOURCE,
        )?
        .min(max_connections);
        Ok(SiteSettings {
            id: id.clone(),
            listen,
            public_url,
            ramdisk_dir: dir,
            ramdisk_api,
            max_connections,
            max_per_source,
        })
    }
}

/// `http://HOST[:PORT][/PATH]`, returned without a trailing `/`. Only
/// characters that need no quoting in an iPXE script.
fn check_public_url(s: &str) -> Result<String, String> {
    let url = Url::parse(s).map_err(|e| format!("not a URL ({e}); expected http://HOST[:PORT]"))?;
    if url.scheme() != "http" {
        return Err(format!(
            "expected an http URL (iPXE fetches over plain HTTP), got scheme {:?}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty)
        || url.query().is_some()
        || !url.username().is_empty()
    {
        return Err("expected http://HOST[:PORT][/PATH], no user, query or fragment".to_owned());
    }
    let text = url.as_str().trim_end_matches('/').to_owned();
    if !text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~:/[]".contains(&b))
    {
        return Err(format!(
            "{text:?} has characters an iPXE script would need quoted"
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::check_public_url;

    #[test]
    fn public_urls_are_plain_http_without_a_trailing_slash() {
        assert_eq!(
            check_public_url("http://10.0.2.2:8080/").as_deref(),
            Ok("http://10.0.2.2:8080")
        );
        assert!(check_public_url("https://site").is_err());
        assert!(check_public_url("http://site/?a=b").is_err());
        assert!(check_public_url("http://site/a b").is_err());
    }
}
