//! `[database]`: a PostgreSQL server instead of `DIR/controlplane.db`
//! (docs/operations.md, "Storage").
//!
//! Parsed and checked here; `store::pg` connects with it.
//! The password never travels in the URL (argv and the environment carry
//! only password-free URLs, by the project's rules): it is read from
//! `password_file`, which must be private, and is kept out of every error
//! and `Debug`. Plain text is for loopback and Unix sockets only; anything
//! else speaks TLS, verified against `ca_file` (no system roots: the
//! deployment pins its database's CA as agents pin the control plane's).

use std::io::Read as _;
use std::net::IpAddr;
use std::ops::Range;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;
use zeroize::Zeroize as _;

/// What is wrong with a database setting: the same three shapes (and
/// words) as a `controlplane.toml` error (`config::ConfigError`), which
/// `config` turns it into.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `line` is 1-based; a problem with the whole file has none.
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        message: String,
    },
    /// A setting from the command line or the environment, which `origin`
    /// names (`--database-url`, `BC_CONTROLPLANE_DATABASE_URL`).
    #[error("{origin}: {message}")]
    Setting {
        origin: &'static str,
        message: String,
    },
}

/// The most pooled connections a replica may hold: each is a PostgreSQL
/// backend process, and the server's own limit (100 by default) is shared
/// by every replica.
pub(crate) const MAX_DB_CONNECTIONS: usize = 256;
/// A password file larger than this is not a password file.
const MAX_PASSWORD_LEN: usize = 4096;

/// `[database]`, checked. `url` holds no password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseConfig {
    /// `postgres://` or `postgresql://`, in libpq's URI form.
    pub url: String,
    /// As written; relative to DIR (see [`DatabaseConfig::password`]).
    pub password_file: Option<PathBuf>,
    /// The roots the server's certificate must chain to, resolved against
    /// DIR. Required unless `sslmode=disable`.
    pub ca_file: Option<PathBuf>,
    /// The pool's size; default 2 × cores + 4 (the handlers, the event
    /// writer, the clock, and slack for the CLI).
    pub max_connections: usize,
    /// `sslmode=disable`: plain text (only to a loopback host or a socket).
    pub(crate) plaintext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDatabase {
    url: Spanned<String>,
    password_file: Option<Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
}

/// The default pool size, capped at [`MAX_DB_CONNECTIONS`].
pub(crate) fn default_max_connections() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores
        .saturating_mul(2)
        .saturating_add(4)
        .min(MAX_DB_CONNECTIONS)
}

/// Checks `[database]` of the file in `dir`; `invalid` makes an error at a
/// span of that file (the caller's error type: the file is the caller's).
pub(crate) fn parse<E>(
    raw: RawDatabase,
    dir: &Path,
    invalid: &dyn Fn(Option<Range<usize>>, String) -> E,
) -> Result<DatabaseConfig, E> {
    let url_span = raw.url.span();
    let url = raw.url.into_inner();
    // The messages never quote the URL: it may hold a password.
    let plaintext = check_url(&url)
        .map_err(|e| invalid(Some(url_span.clone()), format!("database.url: {e}")))?;
    let password_file = match raw.password_file {
        Some(v) if v.get_ref().is_empty() => {
            return Err(invalid(
                Some(v.span()),
                "database.password_file must name a file".to_owned(),
            ))
        }
        v => v.map(|v| PathBuf::from(v.into_inner())),
    };
    let ca_file = match raw.ca_file {
        Some(v) if v.get_ref().is_empty() => {
            return Err(invalid(
                Some(v.span()),
                "database.ca_file must name a file".to_owned(),
            ))
        }
        v => v.map(|v| dir.join(v.into_inner())),
    };
    if !plaintext && ca_file.is_none() {
        return Err(invalid(
            Some(url_span),
            "database.ca_file is required: the server's certificate is checked against it \
             (the system's roots are not used); sslmode=disable is only for loopback"
                .to_owned(),
        ));
    }
    let max_connections = match raw.max_connections {
        None => default_max_connections(),
        Some(v) => {
            let n = *v.get_ref();
            usize::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_DB_CONNECTIONS).contains(n))
                .ok_or_else(|| {
                    invalid(
                        Some(v.span()),
                        format!(
                            "database.max_connections must be from 1 to {MAX_DB_CONNECTIONS}, not {n}"
                        ),
                    )
                })?
        }
    };
    Ok(DatabaseConfig {
        url,
        password_file,
        ca_file,
        max_connections,
        plaintext,
    })
}

/// The URL's checks, for the file and the overrides alike: a libpq URI
/// without a password, plain text only to loopback or a socket. `Ok`:
/// whether it is plain text. The message never quotes the URL.
fn check_url(url: &str) -> Result<bool, String> {
    let parsed = parse_url(url)?;
    if parsed.plaintext {
        if let Some(host) = parsed.hosts.iter().find(|h| !is_local(h)) {
            return Err(format!(
                "sslmode=disable sends the database's traffic in plain text; \
                 it is allowed only to a loopback host or a Unix socket, not {host:?} \
                 (leave sslmode out, or set it to verify-full, and give ca_file)"
            ));
        }
    }
    Ok(parsed.plaintext)
}

/// The flag that names the database on every command that opens DIR's.
pub(crate) const URL_FLAG: &str = "--database-url";
/// The database URL from the environment (the flag wins, `[database] url`
/// loses): a deployment's unit or orchestrator sets it, no file edit.
pub(crate) const URL_ENV: &str = "BC_CONTROLPLANE_DATABASE_URL";
/// The path of the password file (never the password: the environment is
/// readable by whoever can read `/proc/PID/environ`); wins over
/// `[database] password_file`.
pub(crate) const PASSWORD_FILE_ENV: &str = "BC_CONTROLPLANE_DATABASE_PASSWORD_FILE";
/// The roots of the server's certificate; wins over `[database] ca_file`.
pub(crate) const CA_FILE_ENV: &str = "BC_CONTROLPLANE_DATABASE_CA_FILE";

/// What the command line and the environment say of the database; each
/// one wins over its `[database]` key, the keys they leave out still come
/// from the file. Relative paths are relative to DIR, as in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatabaseOverrides {
    /// The URL and where it came from ([`URL_FLAG`] or [`URL_ENV`]).
    pub url: Option<(String, &'static str)>,
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

impl DatabaseOverrides {
    /// `flag` (`--database-url`), else the environment's.
    pub fn from_env(flag: Option<String>) -> Result<Self, SettingsError> {
        let var = |name: &'static str| match std::env::var(name) {
            Ok(v) if v.is_empty() => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(SettingsError::Setting {
                origin: name,
                message: "not UTF-8".to_owned(),
            }),
        };
        let url = match flag {
            Some(url) => Some((url, URL_FLAG)),
            None => var(URL_ENV)?.map(|url| (url, URL_ENV)),
        };
        Ok(DatabaseOverrides {
            url,
            password_file: var(PASSWORD_FILE_ENV)?.map(PathBuf::from),
            ca_file: var(CA_FILE_ENV)?.map(PathBuf::from),
        })
    }

    /// `file` (DIR's `[database]`, if any) with these overrides applied:
    /// the same checks as the file's, the errors naming the flag or the
    /// variable. No URL anywhere: `None`, SQLite (the path overrides have
    /// nothing to apply to).
    pub(crate) fn apply(
        &self,
        dir: &Path,
        file: Option<DatabaseConfig>,
    ) -> Result<Option<DatabaseConfig>, SettingsError> {
        let mut cfg = match (&self.url, file) {
            (None, None) => return Ok(None),
            (None, Some(cfg)) => cfg,
            (Some((url, origin)), file) => {
                let plaintext = check_url(url).map_err(|e| SettingsError::Setting {
                    origin,
                    message: e.replace(
                        "put it in password_file (0600)",
                        &format!("put it in a 0600 file named by [database] password_file or {PASSWORD_FILE_ENV}"),
                    ),
                })?;
                let (password_file, ca_file, max_connections) = match file {
                    Some(f) => (f.password_file, f.ca_file, f.max_connections),
                    None => (None, None, default_max_connections()),
                };
                DatabaseConfig {
                    url: url.clone(),
                    password_file,
                    ca_file,
                    max_connections,
                    plaintext,
                }
            }
        };
        let named = |what: &'static str, p: &Path| {
            if p.as_os_str().is_empty() {
                Err(SettingsError::Setting {
                    origin: what,
                    message: "must name a file".to_owned(),
                })
            } else {
                Ok(())
            }
        };
        if let Some(p) = &self.password_file {
            named(PASSWORD_FILE_ENV, p)?;
            cfg.password_file = Some(p.clone());
        }
        if let Some(p) = &self.ca_file {
            named(CA_FILE_ENV, p)?;
            cfg.ca_file = Some(dir.join(p));
        }
        if !cfg.plaintext && cfg.ca_file.is_none() {
            return Err(SettingsError::Setting {
                origin: self.url.as_ref().map_or(URL_ENV, |(_, o)| o),
                message: format!(
                    "TLS needs the roots the server's certificate is checked against \
                     (the system's roots are not used): [database] ca_file or {CA_FILE_ENV}; \
                     sslmode=disable is only for loopback"
                ),
            });
        }
        Ok(Some(cfg))
    }
}

impl DatabaseConfig {
    /// The password in `password_file` (relative to `dir`), without its
    /// final newline; `None` without the setting. Refused, naming the file:
    /// anything but a regular file, a file group or others may read or
    /// write (0600 or 0400 it must be), an empty, oversized or non-UTF-8
    /// one. The content is in no error.
    pub(crate) fn password(&self, dir: &Path) -> Result<Option<DbPassword>, SettingsError> {
        let Some(file) = &self.password_file else {
            return Ok(None);
        };
        let path = dir.join(file);
        let invalid = |message: String| SettingsError::Invalid {
            path: path.clone(),
            line: None,
            message: format!("database.password_file: {message}"),
        };
        let io = |source| SettingsError::Io {
            path: path.clone(),
            source,
        };
        // The opened file's own metadata: no race with a rename; a FIFO
        // does not block the open. The read below is its own: into one
        // buffer sized once, so the password leaves no stray copies.
        let (f, meta) = bc_wire::file::open_regular(&path, bc_wire::file::Links::Follow).map_err(
            |e| match e {
                bc_wire::file::FileError::NotRegular(_) => invalid("not a regular file".to_owned()),
                e => io(e.into()),
            },
        )?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(invalid(format!(
                "mode {mode:04o} lets group or others at the password: chmod 0600 it"
            )));
        }
        // Sized once, so the read never reallocates (no stray copies).
        let mut bytes = Vec::with_capacity(MAX_PASSWORD_LEN + 2);
        let read = f.take(MAX_PASSWORD_LEN as u64 + 1).read_to_end(&mut bytes);
        let mut secret = DbPassword(String::new());
        match (read, String::from_utf8(bytes)) {
            (Err(e), Ok(text)) => {
                secret.0 = text;
                return Err(io(e));
            }
            (Err(e), Err(bad)) => {
                wipe(bad.into_bytes());
                return Err(io(e));
            }
            (Ok(_), Err(bad)) => {
                wipe(bad.into_bytes());
                return Err(invalid("not UTF-8".to_owned()));
            }
            (Ok(_), Ok(text)) => secret.0 = text,
        }
        if secret.0.len() > MAX_PASSWORD_LEN {
            return Err(invalid(format!("longer than {MAX_PASSWORD_LEN} bytes")));
        }
        let end = secret
            .0
            .strip_suffix("\r\n")
            .or_else(|| secret.0.strip_suffix('\n'))
            .map_or(secret.0.len(), str::len);
        secret.0.truncate(end);
        if secret.0.is_empty() {
            return Err(invalid("empty".to_owned()));
        }
        if secret.0.contains(['\0', '\n']) {
            return Err(invalid(
                "holds a NUL or more than one line (the password only)".to_owned(),
            ));
        }
        Ok(Some(secret))
    }
}

/// The database password: wiped on drop, and never in `Debug`.
pub(crate) struct DbPassword(String);

impl DbPassword {
    /// The password, for the connection's authentication only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DbPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DbPassword(..)")
    }
}

impl Drop for DbPassword {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// Overwrites the buffer (its whole capacity: a truncated tail too) before
/// it is freed; zeroize's writes are volatile, never optimised away.
fn wipe(mut bytes: Vec<u8>) {
    bytes.zeroize();
}

/// What the checks need of a libpq URI.
struct ParsedUrl {
    /// Every host named (authority, `host=`, `hostaddr=`), percent-decoded;
    /// empty: the default Unix socket.
    hosts: Vec<String>,
    plaintext: bool,
}

/// `postgres[ql]://[user@][host[:port][,…]][/dbname][?key=value&…]`.
fn parse_url(url: &str) -> Result<ParsedUrl, String> {
    let rest = url
        .strip_prefix("postgresql://")
        .or_else(|| url.strip_prefix("postgres://"))
        .ok_or("must start with postgres:// or postgresql:// (PostgreSQL's URI form)")?;
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    // The user is what precedes the last '@' (a password may hold '@' or
    // '/'); a ':' in it is a password, even an empty one.
    let (userinfo, hostpart) = match before_query.rfind('@') {
        Some(at) => (&before_query[..at], &before_query[at + 1..]),
        None => ("", before_query),
    };
    if userinfo.contains(':') {
        return Err("holds a password: put it in password_file (0600), not in the URL".to_owned());
    }
    let authority = hostpart.split_once('/').map_or(hostpart, |(a, _)| a);
    let mut hosts = Vec::new();
    for spec in authority.split(',').filter(|s| !s.is_empty()) {
        let (host, port) = split_host_port(spec)?;
        if let Some(port) = port {
            if port.parse::<u16>().ok().filter(|p| *p != 0).is_none() {
                return Err(format!("bad port {port:?}"));
            }
        }
        hosts.push(percent_decode(host)?);
    }
    let mut plaintext = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key)?;
        if key == "password" {
            return Err(
                "holds a password: put it in password_file (0600), not in the URL".to_owned(),
            );
        }
        let value = percent_decode(value)?;
        match key.as_str() {
            "host" | "hostaddr" => hosts.extend(value.split(',').map(str::to_owned)),
            "sslmode" => {
                plaintext = match value.as_str() {
                    "disable" => true,
                    "require" | "verify-ca" | "verify-full" => false,
                    other => {
                        return Err(format!(
                            "sslmode must be disable (loopback only), require, verify-ca or \
                             verify-full (all three verify the certificate against ca_file), \
                             not {other:?}: allow and prefer fall back to plain text"
                        ))
                    }
                }
            }
            _ => {}
        }
    }
    Ok(ParsedUrl { hosts, plaintext })
}

/// `host[:port]` or `[v6][:port]`.
fn split_host_port(spec: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(v6) = spec.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("an IPv6 host's '[' has no ']'")?;
        return match after {
            "" => Ok((host, None)),
            _ => after
                .strip_prefix(':')
                .map(|p| (host, Some(p)))
                .ok_or_else(|| "junk after an IPv6 host's ']'".to_owned()),
        };
    }
    Ok(match spec.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (spec, None),
    })
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a '%' not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-decodes to something not UTF-8".to_owned())
}

/// A Unix socket directory, `localhost` or a loopback address.
fn is_local(host: &str) -> bool {
    host.is_empty()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    use crate::config::{parse, Config, ConfigError};

    fn p(text: &str) -> Result<Config, ConfigError> {
        parse(Path::new("/d/controlplane.toml"), text)
    }

    /// The error of `[database]` + `body`, which must be at `line` (the
    /// section header is line 1).
    fn err_at(body: &str, line: usize) -> String {
        let e = match p(&format!("[database]\n{body}")) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("accepted: {body}: {:?}", c.database),
        };
        assert!(
            e.starts_with(&format!("/d/controlplane.toml:{line}: ")),
            "{body}: {e}"
        );
        e
    }

    #[test]
    fn absent_is_sqlite_and_a_full_section_parses() {
        assert_eq!(p("").unwrap().database, None);
        let c = p(
            "[database]\nurl = \"postgres://bcd@db.example:5432/bcd?sslmode=verify-full\"\n\
                   password_file = \"/etc/bc-controlplane/db.password\"\n\
                   ca_file = \"db-ca.pem\"\nmax_connections = 8\n",
        )
        .unwrap()
        .database
        .unwrap();
        assert_eq!(
            c.url,
            "postgres://bcd@db.example:5432/bcd?sslmode=verify-full"
        );
        assert_eq!(
            c.password_file.as_deref(),
            Some(Path::new("/etc/bc-controlplane/db.password"))
        );
        assert_eq!(c.ca_file.as_deref(), Some(Path::new("/d/db-ca.pem")));
        assert_eq!(c.max_connections, 8);
        assert!(!c.plaintext);
        // The default pool: 2 × cores + 4.
        let cores = std::thread::available_parallelism().unwrap().get();
        let c = p("[database]\nurl = \"postgresql://bcd@[::1]/bcd?sslmode=disable\"\n")
            .unwrap()
            .database
            .unwrap();
        assert_eq!(c.max_connections, (2 * cores + 4).min(256));
        assert!(c.plaintext);
        assert_eq!(c.ca_file, None);
    }

    #[test]
    fn a_password_in_the_url_is_refused_without_echoing_it() {
        for url in [
            "postgres://bcd:hunter2@db.example/bcd",
            "postgres://bcd:@db.example/bcd",
            "postgres://bcd:hun/ter2@db.example/bcd",
            "postgres://bcd:hun@ter2@db.example/bcd",
            "postgres://bcd@db.example/bcd?sslmode=verify-full&password=hunter2",
            "postgres://bcd@db.example/bcd?pass%77ord=hunter2",
        ] {
            let e = err_at(&format!("ca_file = \"ca.pem\"\nurl = \"{url}\"\n"), 3);
            assert!(e.contains("database.url"), "{e}");
            assert!(e.contains("put it in password_file"), "{e}");
            assert!(!e.contains("hunter2") && !e.contains("ter2"), "{e}");
        }
    }

    #[test]
    fn only_postgres_urls() {
        for url in [
            "mysql://bcd@db/bcd",
            "sqlite:///d/controlplane.db",
            "db.example",
            "",
        ] {
            let e = err_at(&format!("url = \"{url}\"\n"), 2);
            assert!(
                e.contains("database.url: must start with postgres://"),
                "{e}"
            );
        }
        for bad in [
            "postgres://bcd@db:0/bcd",
            "postgres://bcd@db:x/bcd",
            "postgres://bcd@[::1/bcd",
            "postgres://bcd@db/bcd?sslmode=%zz",
        ] {
            let e = err_at(&format!("url = \"{bad}\"\nca_file = \"c.pem\"\n"), 2);
            assert!(e.contains("database.url: "), "{e}");
        }
    }

    #[test]
    fn plaintext_only_to_loopback_or_a_socket() {
        for local in [
            "postgres://bcd@127.0.0.1/bcd?sslmode=disable",
            "postgres://bcd@127.9.9.9:5433/bcd?sslmode=disable",
            "postgres://bcd@localhost/bcd?sslmode=disable",
            "postgres://bcd@[::1]:5432/bcd?sslmode=disable",
            "postgres://bcd@%2Frun%2Fpostgresql/bcd?sslmode=disable",
            "postgres:///bcd?host=/run/postgresql&sslmode=disable",
            "postgres:///bcd?sslmode=disable",
        ] {
            let c = p(&format!("[database]\nurl = \"{local}\"\n"));
            assert!(
                c.is_ok_and(|c| c.database.is_some_and(|d| d.plaintext)),
                "{local}"
            );
        }
        for remote in [
            "postgres://bcd@db.example/bcd?sslmode=disable",
            "postgres://bcd@10.0.0.5/bcd?sslmode=disable",
            "postgres://bcd@localhost,db.example/bcd?sslmode=disable",
            "postgres://bcd@localhost/bcd?hostaddr=10.0.0.5&sslmode=disable",
            "postgres:///bcd?host=db.example&sslmode=disable",
        ] {
            let e = err_at(&format!("\nurl = \"{remote}\"\n"), 3);
            assert!(e.contains("sslmode=disable"), "{e}");
            assert!(e.contains("loopback"), "{e}");
        }
        // TLS that falls back to plain text is no TLS.
        for mode in ["prefer", "allow", "bogus"] {
            let e = err_at(
                &format!("url = \"postgres://bcd@db/bcd?sslmode={mode}\"\nca_file = \"c.pem\"\n"),
                2,
            );
            assert!(e.contains("sslmode must be"), "{e}");
        }
        // TLS needs the roots.
        let e = err_at("url = \"postgres://bcd@db.example/bcd\"\n", 2);
        assert!(e.contains("database.ca_file is required"), "{e}");
        let e = err_at(
            "url = \"postgres://bcd@127.0.0.1/bcd?sslmode=require\"\n",
            2,
        );
        assert!(e.contains("database.ca_file is required"), "{e}");
    }

    #[test]
    fn bounds_and_unknown_keys() {
        let url = "url = \"postgres://bcd@127.0.0.1/bcd?sslmode=disable\"\n";
        for n in [0, 257, -1] {
            let e = err_at(&format!("{url}max_connections = {n}\n"), 3);
            assert!(
                e.contains("database.max_connections must be from 1 to 256"),
                "{e}"
            );
        }
        for n in [1, 256] {
            let c = p(&format!("[database]\n{url}max_connections = {n}\n")).unwrap();
            assert_eq!(c.database.unwrap().max_connections, n as usize);
        }
        let e = err_at(&format!("{url}password = \"x\"\n"), 3);
        assert!(e.contains("unknown field `password`"), "{e}");
        let e = err_at(&format!("{url}\nsslrootcert = \"x\"\n"), 4);
        assert!(e.contains("unknown field `sslrootcert`"), "{e}");
        // The url is required.
        let e = p("[database]\nca_file = \"c.pem\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("url"), "{e}");
        for key in ["password_file", "ca_file"] {
            let e = err_at(&format!("{url}{key} = \"\"\n"), 3);
            assert!(
                e.contains(&format!("database.{key} must name a file")),
                "{e}"
            );
        }
    }

    #[test]
    fn password_file_is_read_only_when_private() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = |file: &str| {
            parse(
                &d.join("controlplane.toml"),
                &format!(
                    "[database]\nurl = \"postgres://bcd@127.0.0.1/bcd?sslmode=disable\"\n\
                     password_file = \"{file}\"\n"
                ),
            )
            .unwrap()
            .database
            .unwrap()
        };
        let write = |name: &str, text: &str, mode: u32| {
            let path = d.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        // Without the setting: no password (trust, or a client certificate).
        let none = p("[database]\nurl = \"postgres:///bcd?sslmode=disable\"\n").unwrap();
        assert!(none.database.unwrap().password(d).unwrap().is_none());

        write("pw", "s3cret-pass\n", 0o600);
        let pw = config("pw").password(d).unwrap().unwrap();
        assert_eq!(pw.expose(), "s3cret-pass");
        assert_eq!(format!("{pw:?}"), "DbPassword(..)");
        write("pw-crlf", "s3cret-pass\r\n", 0o400);
        assert_eq!(
            config("pw-crlf").password(d).unwrap().unwrap().expose(),
            "s3cret-pass"
        );
        // An absolute path is taken as it is.
        let abs = d.join("pw").display().to_string();
        assert!(config(&abs).password(Path::new("/nonexistent")).is_ok());

        let refused = |file: &str, what: &str| {
            let e = config(file).password(d).unwrap_err().to_string();
            assert!(e.starts_with(&d.join(file).display().to_string()), "{e}");
            assert!(e.contains(what), "{file}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        };
        for (name, mode) in [("pw-g", 0o640), ("pw-o", 0o604), ("pw-gw", 0o620)] {
            write(name, "s3cret-pass\n", mode);
            refused(name, &format!("mode {mode:04o}"));
        }
        std::fs::create_dir(d.join("pw-dir")).unwrap();
        std::fs::set_permissions(d.join("pw-dir"), std::fs::Permissions::from_mode(0o700)).unwrap();
        refused("pw-dir", "not a regular file");
        refused("pw-missing", "No such file");
        write("pw-empty", "\n", 0o600);
        refused("pw-empty", "empty");
        write("pw-lines", "s3cret-pass\nmore\n", 0o600);
        refused("pw-lines", "more than one line");
        write("pw-big", &"s3cret".repeat(1000), 0o600);
        refused("pw-big", "longer than 4096 bytes");
        let path = d.join("pw-bin");
        std::fs::write(&path, b"s3cret\xff\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        refused("pw-bin", "not UTF-8");
    }

    #[test]
    fn overrides_win_key_by_key_with_the_file_s_checks() {
        use super::{DatabaseOverrides, CA_FILE_ENV, PASSWORD_FILE_ENV, URL_ENV, URL_FLAG};
        let dir = Path::new("/d");
        let flag = |url: &str| DatabaseOverrides {
            url: Some((url.to_owned(), URL_FLAG)),
            ..DatabaseOverrides::default()
        };
        // Nothing anywhere: SQLite, whatever the path variables say.
        let paths_only = DatabaseOverrides {
            password_file: Some("pw".into()),
            ..DatabaseOverrides::default()
        };
        assert_eq!(paths_only.apply(dir, None).unwrap(), None);
        // A password is refused from argv and env alike, never echoed.
        for (url, origin) in [
            (
                "postgres://bcd:hunter2@127.0.0.1/bcd?sslmode=disable",
                URL_FLAG,
            ),
            ("postgres://bcd@127.0.0.1/bcd?password=hunter2", URL_ENV),
        ] {
            let o = DatabaseOverrides {
                url: Some((url.to_owned(), origin)),
                ..DatabaseOverrides::default()
            };
            let e = o.apply(dir, None).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{origin}: holds a password")), "{e}");
            assert!(
                e.contains("password_file") && e.contains(PASSWORD_FILE_ENV),
                "{e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
        // The flag alone: loopback plain text.
        let c = flag("postgres://bcd@127.0.0.1:5/bcd?sslmode=disable")
            .apply(dir, None)
            .unwrap()
            .unwrap();
        assert!(c.plaintext);
        assert_eq!(c.max_connections, super::default_max_connections());
        assert_eq!((c.password_file, c.ca_file), (None, None));
        // ... not plain text elsewhere, and TLS needs roots.
        let e = flag("postgres://bcd@db.example/bcd?sslmode=disable")
            .apply(dir, None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--database-url: sslmode=disable"), "{e}");
        let e = flag("postgres://bcd@db.example/bcd")
            .apply(dir, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(CA_FILE_ENV) && e.contains("ca_file"), "{e}");
        let tls = DatabaseOverrides {
            ca_file: Some("db-ca.pem".into()),
            password_file: Some("/run/pw".into()),
            ..flag("postgres://bcd@db.example/bcd")
        };
        let c = tls.apply(dir, None).unwrap().unwrap();
        assert_eq!(c.ca_file.as_deref(), Some(Path::new("/d/db-ca.pem")));
        assert_eq!(c.password_file.as_deref(), Some(Path::new("/run/pw")));
        assert!(!c.plaintext);
        // Over the file: the URL replaced, the other keys kept.
        let file = p(
            "[database]\nurl = \"postgres://bcd@db.example/old?sslmode=verify-full\"\n\
                      password_file = \"file.pw\"\nca_file = \"ca.pem\"\nmax_connections = 3\n",
        )
        .unwrap()
        .database;
        let c = flag("postgres://bcd@db2.example/new")
            .apply(dir, file.clone())
            .unwrap()
            .unwrap();
        assert_eq!(c.url, "postgres://bcd@db2.example/new");
        assert_eq!(c.password_file.as_deref(), Some(Path::new("file.pw")));
        assert_eq!(c.ca_file.as_deref(), Some(Path::new("/d/ca.pem")));
        assert_eq!(c.max_connections, 3);
        // No URL override: the file's, with the path variables over it.
        let c = paths_only.apply(dir, file).unwrap().unwrap();
        assert_eq!(c.url, "postgres://bcd@db.example/old?sslmode=verify-full");
        assert_eq!(c.password_file.as_deref(), Some(Path::new("pw")));
        let empty = DatabaseOverrides {
            ca_file: Some("".into()),
            ..flag("postgres://bcd@127.0.0.1/bcd?sslmode=disable")
        };
        let e = empty.apply(dir, None).unwrap_err().to_string();
        assert_eq!(e, format!("{CA_FILE_ENV}: must name a file"));
    }
}
