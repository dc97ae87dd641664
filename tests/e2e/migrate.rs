//! `bc-controlplane migrate` and the database settings every command takes
//! (issue 21): `--database-url`, `BC_CONTROLPLANE_DATABASE_URL`,
//! `BC_CONTROLPLANE_DATABASE_PASSWORD_FILE` and `_CA_FILE`, through the real
//! binary, on a real SQLite file and the tests' real PostgreSQL (TLS and a
//! scram-sha-256 password). No password is ever in argv: the one a test
//! puts in a URL is there to be refused.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::harness::*;
use crate::pg_cluster::{PgCluster, PgDb};

/// The schema version this build migrates to: what a fresh database reaches.
fn latest(dir: &Path) -> u64 {
    let out = bc(dir, &["migrate", "--json"], &[]);
    assert_ok(&out);
    json(&out)["to"].as_u64().expect("to")
}

/// `bc-controlplane ARGS --dir DIR` with `env` set and every other
/// `BC_CONTROLPLANE_DATABASE_*` variable removed.
fn bc(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    bc_env(
        dir,
        args,
        &env.iter()
            .map(|(k, v)| (*k, v.as_os_str()))
            .collect::<Vec<_>>(),
    )
}

fn bc_env(dir: &Path, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = Command::new(bin("bc-controlplane"));
    cmd.args(args).arg("--dir").arg(dir).stdin(Stdio::null());
    for var in [
        "BC_CONTROLPLANE_DATABASE_URL",
        "BC_CONTROLPLANE_DATABASE_PASSWORD_FILE",
        "BC_CONTROLPLANE_DATABASE_CA_FILE",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    output_within(cmd, DEADLINE)
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

/// The variables that give the tests' PostgreSQL its CA and password.
fn pg_env(pg: &PgDb) -> Vec<(&'static str, std::path::PathBuf)> {
    vec![
        (
            "BC_CONTROLPLANE_DATABASE_CA_FILE",
            PgCluster::shared().ca_file(),
        ),
        (
            "BC_CONTROLPLANE_DATABASE_PASSWORD_FILE",
            pg.password_file.clone(),
        ),
    ]
}

fn env_refs<'a>(env: &'a [(&'static str, std::path::PathBuf)]) -> Vec<(&'static str, &'a Path)> {
    env.iter().map(|(k, v)| (*k, v.as_path())).collect()
}

#[test]
fn migrate_on_a_fresh_sqlite_dir_then_again_is_a_no_op() {
    let cp = ControlPlane::init_only_on(Backend::Sqlite);
    let db = cp.path().join("controlplane.db");
    // init migrated it; a DIR whose database is gone starts from 0.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let out = bc(cp.path(), &["migrate", "--check"], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("pending"), "{}", stderr(&out));
    assert!(!db.exists(), "--check creates nothing");

    let out = bc(cp.path(), &["migrate", "--json"], &[]);
    assert_ok(&out);
    let v = json(&out);
    assert_eq!(v["backend"], "sqlite");
    assert_eq!(v["database"], db.display().to_string());
    assert_eq!(v["from"], 0);
    let to = v["to"].as_u64().unwrap();
    assert!(to >= 18, "{v}");
    assert_eq!(v["applied"], to);
    assert_eq!(
        std::fs::metadata(&db).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let out = bc(cp.path(), &["migrate"], &[]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out).trim(),
        format!("{}: already at schema version {to}", db.display())
    );
    let out = bc(cp.path(), &["migrate", "--check", "--json"], &[]);
    assert_ok(&out);
    assert_eq!(json(&out)["pending"], 0);

    // A database a newer bc-controlplane migrated is refused, and left so.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", to + 5).unwrap();
    drop(conn);
    for args in [&["migrate"][..], &["migrate", "--check"]] {
        let out = bc(cp.path(), args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "schema version {}, newer than this bc-controlplane",
                to + 5
            )) && err.contains("use a newer bc-controlplane"),
            "{err}"
        );
    }
}

/// A fresh PostgreSQL database named only by `--database-url` (no
/// `[database]` in DIR): the CA and the password from the environment.
#[test]
fn migrate_on_a_fresh_postgres_database_by_flag_and_env() {
    let cp = ControlPlane::init_only_on(Backend::Sqlite);
    let want = latest(cp.path());
    let pg = PgCluster::shared().database();
    let env = pg_env(&pg);
    let env = env_refs(&env);
    let url = pg.url.as_str();

    let out = bc(
        cp.path(),
        &["migrate", "--check", "--json", "--database-url", url],
        &env,
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(
        (v["backend"].as_str(), v["version"].as_u64()),
        (Some("postgres"), Some(0))
    );
    assert_eq!(v["pending"].as_u64(), Some(want));
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"),
        "0",
        "--check creates nothing"
    );

    let out = bc(
        cp.path(),
        &["migrate", "--json", "--database-url", url],
        &env,
    );
    assert_ok(&out);
    let v = json(&out);
    assert_eq!(v["backend"], "postgres");
    let server = format!(
        "PostgreSQL 127.0.0.1:{}/{}",
        PgCluster::shared().port(),
        pg.name
    );
    assert_eq!(v["database"], server);
    assert_eq!(
        (v["from"].as_u64(), v["to"].as_u64()),
        (Some(0), Some(want))
    );
    assert_eq!(pg.psql("SELECT version FROM bcd_schema"), want.to_string());

    // Again, the URL from the environment this time: nothing to do.
    let mut with_url = env.clone();
    with_url.push(("BC_CONTROLPLANE_DATABASE_URL", Path::new(url)));
    let out = bc(cp.path(), &["migrate"], &with_url);
    assert_ok(&out);
    assert_eq!(
        stdout(&out).trim(),
        format!("{server}: already at schema version {want}")
    );
    // Every command opens that database: a token made there is listed
    // there, and not in DIR's SQLite file.
    let out = bc(cp.path(), &["token", "create", "--role", "node"], &with_url);
    assert_ok(&out);
    assert_eq!(pg.psql("SELECT count(*) FROM join_tokens"), "1");
    let out = bc(cp.path(), &["token", "list", "--json"], &[]);
    assert_ok(&out);
    assert_eq!(json(&out).as_array().map(Vec::len), Some(0));

    // A database migrated by a newer bc-controlplane: refused, unchanged.
    pg.psql(&format!("UPDATE bcd_schema SET version = {}", want + 3));
    for args in [&["migrate"][..], &["migrate", "--check"]] {
        let out = bc(cp.path(), args, &with_url);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&server) && err.contains(&format!("schema version {}, newer", want + 3)),
            "{err}"
        );
    }
    assert_eq!(
        pg.psql("SELECT version FROM bcd_schema"),
        (want + 3).to_string()
    );
}

/// `[database]` in DIR (the harness's: CA and password file) and `serve`
/// migrating at start; the flag wins over the file's URL and keeps its
/// other keys.
#[test]
fn the_flag_wins_over_the_file_and_keeps_its_password_and_ca() {
    let cp = ControlPlane::init_only_on(Backend::Postgres);
    let want = latest(cp.path());
    let other = PgCluster::shared().database();
    let out = bc(
        cp.path(),
        &["migrate", "--json", "--database-url", &other.url],
        &[],
    );
    assert_ok(&out);
    let v = json(&out);
    assert_eq!(
        (v["from"].as_u64(), v["to"].as_u64()),
        (Some(0), Some(want))
    );
    assert!(
        v["database"].as_str().unwrap().ends_with(&other.name),
        "{v}"
    );
    // DIR's own database was migrated by init.
    let out = bc(cp.path(), &["migrate", "--json"], &[]);
    assert_ok(&out);
    assert_eq!(json(&out)["applied"], 0);
}

/// No `[database]`, no variables: a plain-text URL to the server's Unix
/// socket (loopback only) is all it takes.
#[test]
fn the_flag_alone_reaches_a_local_socket_in_plain_text() {
    let cp = ControlPlane::init_only_on(Backend::Sqlite);
    let want = latest(cp.path());
    let cluster = PgCluster::shared();
    let pg = cluster.database();
    let socket = cluster
        .socket_dir()
        .display()
        .to_string()
        .replace('/', "%2F");
    let url = format!(
        "postgres://bcd@{socket}:{}/{}?sslmode=disable",
        cluster.port(),
        pg.name
    );
    let out = bc(
        cp.path(),
        &["migrate", "--json", "--database-url", &url],
        &[],
    );
    assert_ok(&out);
    let v = json(&out);
    assert_eq!(
        (v["from"].as_u64(), v["to"].as_u64()),
        (Some(0), Some(want))
    );
    assert_eq!(pg.psql("SELECT version FROM bcd_schema"), want.to_string());
    // The same URL to a host that is not local is refused.
    let remote = format!("postgres://bcd@db.example/{}?sslmode=disable", pg.name);
    let out = bc(cp.path(), &["migrate", "--database-url", &remote], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--database-url: sslmode=disable"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_password_in_a_url_is_refused_from_argv_and_env_without_echoing_it() {
    let cp = ControlPlane::init_only_on(Backend::Sqlite);
    let secret = "Pw-4fd81c";
    let url = format!("postgres://bcd:{secret}@127.0.0.1:5432/bcd?sslmode=disable");
    let flag = bc(cp.path(), &["migrate", "--database-url", &url], &[]);
    let env = bc_env(
        cp.path(),
        &["token", "list"],
        &[("BC_CONTROLPLANE_DATABASE_URL", url.as_ref())],
    );
    for (out, origin) in [
        (flag, "--database-url"),
        (env, "BC_CONTROLPLANE_DATABASE_URL"),
    ] {
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{origin}: holds a password")),
            "{err}"
        );
        assert!(
            err.contains("password_file") && err.contains("BC_CONTROLPLANE_DATABASE_PASSWORD_FILE"),
            "{err}"
        );
        assert!(
            !err.contains(secret) && !stdout(&out).contains(secret),
            "{err}"
        );
    }
    // In the query string too.
    let url = format!("postgres://bcd@127.0.0.1/bcd?sslmode=disable&password={secret}");
    let out = bc(cp.path(), &["migrate", "--database-url", &url], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains(secret), "{}", stderr(&out));
}

#[test]
fn an_unreachable_server_or_a_wrong_password_fails_with_a_clear_error() {
    let cp = ControlPlane::init_only_on(Backend::Sqlite);
    // Nothing listens on port 1.
    let out = bc(
        cp.path(),
        &[
            "migrate",
            "--database-url",
            "postgres://bcd@127.0.0.1:1/bcd?sslmode=disable",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("connecting to PostgreSQL 127.0.0.1:1/bcd"),
        "{err}"
    );

    // serve, on a [database] whose password file holds the wrong one.
    let cp = ControlPlane::init_only_on(Backend::Postgres);
    let pg = cp.pg.clone().expect("on PostgreSQL");
    let wrong = cp.path().join("wrong.password");
    std::fs::write(&wrong, "not-the-Pw-77c1\n").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let env = [("BC_CONTROLPLANE_DATABASE_PASSWORD_FILE", wrong.as_path())];
    let out = bc(cp.path(), &["serve", "--listen", "127.0.0.1:0"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let server = format!(
        "PostgreSQL 127.0.0.1:{}/{}",
        PgCluster::shared().port(),
        pg.name
    );
    assert!(err.contains(&server), "{err}");
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(!err.contains("not-the-Pw"), "{err}");
    // A password file others may read is refused before any connection.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = bc(cp.path(), &["migrate"], &env);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("mode 0644") && err.contains("chmod 0600"),
        "{err}"
    );
    // With the right one (DIR's [database] password_file), serve starts.
    let cp = cp.serve_wrapped(&[]);
    assert!(cp.url.starts_with("https://127.0.0.1:"), "{}", cp.url);
}
