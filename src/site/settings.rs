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
pub struct RawSite {
    id: Spanned<String>,
    listen: Spanned<String>,
    public_url: Spanned<String>,
    ramdisk_dir: Spanned<String>,
    ramdisk_api: Spanned<String>,
}

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
}

impl RawSite {
    /// Checks every field; the error is the span of the bad value and the
    /// message.
    pub fn check(
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
        Ok(SiteSettings {
            id: id.clone(),
            listen,
            public_url,
            ramdisk_dir: dir,
            ramdisk_api,
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
