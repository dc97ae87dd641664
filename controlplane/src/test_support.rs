//! Fixtures shared by the unit tests that run a real control plane DIR
//! (PKI bundle, SQLite file): one place for how a test makes a DIR, a node
//! key, a CSR, a token join and a certificate, so the join, attestor, Renew
//! and HTTP tests cannot drift apart.

use bc_wire::AttestorId;
use std::sync::Arc;

use bc_wire::agent::{JoinRequest, JoinResponseBody, Role};
use prost::Message;
use rcgen::{KeyPair, PublicKeyData};

use crate::model::records;
use crate::pki::NodeCertSpec;
use crate::plane::join::JoinService;
use crate::plane::ControlPlane;
use crate::store::{self, Store, UnixMs};

/// The trust domain of every fixture DIR.
pub(crate) const TRUST_DOMAIN: &str = "bc.test";

/// A control plane DIR (removed on drop) and the ControlPlane on it.
pub(crate) struct Cp {
    pub(crate) svc: Arc<ControlPlane>,
    _dir: tempfile::TempDir,
    /// The PostgreSQL database `[database]` names, if any.
    _pg: Option<crate::pg_cluster::PgDb>,
}

impl Cp {
    /// The DIR.
    pub(crate) fn path(&self) -> &std::path::Path {
        self._dir.path()
    }
}

/// A fresh DIR with the default configuration.
pub(crate) fn cp() -> Cp {
    cp_with(None, |_| {})
}

/// A fresh DIR with `controlplane.toml` (when given) and whatever `prepare`
/// writes into it before the service opens it. On the backend
/// [`default_backend`] says.
pub(crate) fn cp_with(toml: Option<&str>, prepare: impl FnOnce(&std::path::Path)) -> Cp {
    cp_on_with(default_backend(), toml, prepare)
}

/// A fresh DIR with the default configuration on `backend`.
pub(crate) fn cp_on(backend: Backend) -> Cp {
    cp_on_with(backend, None, |_| {})
}

/// As [`cp_with`], on `backend` (PostgreSQL: a `[database]` section naming
/// a fresh database is appended to the config).
pub(crate) fn cp_on_with(
    backend: Backend,
    toml: Option<&str>,
    prepare: impl FnOnce(&std::path::Path),
) -> Cp {
    let dir = tempfile::tempdir().unwrap();
    crate::pki::init(dir.path(), TRUST_DOMAIN).unwrap();
    let pg = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(crate::pg_cluster::PgCluster::shared().database()),
    };
    let mut text = toml.unwrap_or_default().to_owned();
    if let Some(pg) = &pg {
        let cfg = pg_config(pg);
        text.push_str(&format!(
            "\n[database]\nurl = {:?}\nca_file = {:?}\npassword_file = {:?}\nmax_connections = 8\n",
            cfg.url,
            cfg.ca_file.unwrap(),
            cfg.password_file.unwrap()
        ));
    }
    if !text.is_empty() {
        std::fs::write(dir.path().join(crate::config::CONFIG_FILE), text).unwrap();
    }
    prepare(dir.path());
    let svc = Arc::new(ControlPlane::open(dir.path()).unwrap());
    Cp {
        svc,
        _dir: dir,
        _pg: pg,
    }
}

/// The backend of the fixtures that do not name one: SQLite, or PostgreSQL
/// when `BCD_TEST_DB=postgres` (a whole-suite run on PG, to find the SQL
/// that is not portable; the tests that read SQLite itself fail there).
pub(crate) fn default_backend() -> Backend {
    match std::env::var("BCD_TEST_DB").as_deref() {
        Ok("postgres") => Backend::Postgres,
        _ => Backend::Sqlite,
    }
}

/// A bare database in a temporary DIR (removed on drop), without a PKI
/// bundle: for the tests below JoinService.
pub(crate) struct TempDb {
    // Before `pg`: the pool's sessions end before the database is dropped.
    pub(crate) db: Store,
    _dir: tempfile::TempDir,
    pub(crate) pg: Option<crate::pg_cluster::PgDb>,
}

/// A bare database on the backend [`default_backend`] says.
pub(crate) fn temp_db() -> TempDb {
    temp_db_on(default_backend())
}

/// A bare SQLite database.
pub(crate) fn temp_sqlite() -> TempDb {
    let dir = tempfile::tempdir().unwrap();
    let db = Store::open_dir(dir.path()).unwrap();
    TempDb {
        db,
        _dir: dir,
        pg: None,
    }
}

impl TempDb {
    /// A second [`Store`] on the same database (another process's view).
    pub(crate) fn reopen(&self) -> Store {
        match &self.pg {
            None => Store::open(self.db.path().unwrap()).unwrap(),
            Some(pg) => Store::open_configured(self._dir.path(), Some(&pg_config(pg))).unwrap(),
        }
    }
}

/// Which database a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// The `[database]` of a fresh database on the tests' PostgreSQL server
/// (TLS, verified against its CA; the superuser's password from its file).
pub(crate) fn pg_config(pg: &crate::pg_cluster::PgDb) -> crate::config::DatabaseConfig {
    crate::config::DatabaseConfig {
        url: pg.url.clone(),
        password_file: Some(pg.password_file.clone()),
        ca_file: Some(crate::pg_cluster::PgCluster::shared().ca_file()),
        max_connections: 4,
        plaintext: false,
    }
}

/// A bare, migrated database on `backend`.
pub(crate) fn temp_db_on(backend: Backend) -> TempDb {
    match backend {
        Backend::Sqlite => temp_sqlite(),
        Backend::Postgres => {
            let dir = tempfile::tempdir().unwrap();
            let pg = crate::pg_cluster::PgCluster::shared().database();
            let db = Store::open_configured(dir.path(), Some(&pg_config(&pg))).unwrap();
            TempDb {
                db,
                _dir: dir,
                pg: Some(pg),
            }
        }
    }
}

/// A database on `backend` as an older bc-controlplane left it: migrated
/// to version `applied`, then `seed` run on it; then opened (and migrated
/// the rest of the way) as today's opens it.
pub(crate) fn old_db_on(backend: Backend, applied: usize, seed: &str) -> TempDb {
    let dir = tempfile::tempdir().unwrap();
    match backend {
        Backend::Sqlite => {
            let path = dir.path().join(store::DB_FILE);
            store::sqlite::old_database(&path, applied, seed);
            let db = Store::open(&path).unwrap();
            TempDb {
                db,
                _dir: dir,
                pg: None,
            }
        }
        Backend::Postgres => {
            let pg = crate::pg_cluster::PgCluster::shared().database();
            let cfg = pg_config(&pg);
            store::pg_schema::old_database(&cfg, applied, seed);
            let db = Store::open_configured(dir.path(), Some(&cfg)).unwrap();
            TempDb {
                db,
                _dir: dir,
                pg: Some(pg),
            }
        }
    }
}

/// Runs each test fn (`fn name(backend: Backend)`) once per backend:
/// `name::sqlite` and `name::pg`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn sqlite() {
                super::$name($crate::test_support::Backend::Sqlite)
            }
            #[test]
            fn pg() {
                super::$name($crate::test_support::Backend::Postgres)
            }
        }
    )*};
}
pub(crate) use both_backends;

/// Inserts a live node `id` (role node, generation 1, pool default), as a
/// join by `attestor` at `joined_at` would.
pub(crate) fn insert_node(db: &Store, id: &str, attestor: AttestorId, joined_at: UnixMs) {
    db.write(|tx| {
        records::insert_node(
            tx,
            &records::NodeRow {
                id: id.to_owned(),
                role: bc_wire::agent::Role::Node,
                identity_generation: 1,
                attestor,
                joined_at,
                retired_at: None,
                pool_id: crate::model::pools::DEFAULT_POOL.to_owned(),
                cordoned_at: None,
                deleted_at: None,
            },
        )
    })
    .unwrap();
}

/// A P-256 node key, as bcd makes one.
pub(crate) fn key() -> KeyPair {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
}

/// A CSR for `key` that asks for nothing.
pub(crate) fn plain_csr(key: &KeyPair) -> Vec<u8> {
    rcgen::CertificateParams::default()
        .serialize_request(key)
        .unwrap()
        .der()
        .to_vec()
}

/// The URI SANs of a certificate, in order.
pub(crate) fn uri_sans(der: &[u8]) -> Vec<String> {
    let (_, leaf) = x509_parser::parse_x509_certificate(der).unwrap();
    leaf.subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

impl Cp {
    pub(crate) fn db(&self) -> &Store {
        self.svc.database()
    }

    /// The database's time.
    pub(crate) fn now(&self) -> UnixMs {
        self.db().read(|tx| tx.now()).unwrap()
    }

    pub(crate) fn move_clock(&self, offset_ms: i64) {
        self.db()
            .write(|tx| store::set_clock_offset_ms(tx, offset_ms))
            .unwrap();
    }

    /// `token` (`tok_<id>.<secret>`) sealed to this control plane for `csr`,
    /// as an agent sends it.
    pub(crate) fn seal_token(&self, csr: &[u8], token: &str) -> Vec<u8> {
        bc_wire::sealing::SealingKey::from_spki_der(self.svc.bundle().join_encryption_spki_der())
            .unwrap()
            .seal(&bc_wire::sha256(csr), token.as_bytes())
            .unwrap()
    }

    /// A join request of `role` with a fresh single-use token (whose nodes
    /// join `pool`), and the key its CSR is for.
    pub(crate) fn token_request(&self, role: Role, pool: Option<&str>) -> (JoinRequest, KeyPair) {
        let (tok, _) =
            crate::model::tokens::create_token_in_pool(self.db(), role, 1, 3_600_000, pool)
                .unwrap();
        let key = key();
        let csr = plain_csr(&key);
        let sealed_token = self.seal_token(&csr, &tok.expose());
        let req = JoinRequest {
            csr,
            role: role as i32,
            sealed_token,
            ..Default::default()
        };
        (req, key)
    }

    /// Joins a node of `role` with a token (into `pool`): the answer's body
    /// and the node key.
    pub(crate) fn token_join(&self, role: Role, pool: Option<&str>) -> (JoinResponseBody, KeyPair) {
        let (req, key) = self.token_request(role, pool);
        let resp = JoinService::new(&self.svc).join(req).unwrap();
        (JoinResponseBody::decode(resp.body.as_slice()).unwrap(), key)
    }

    /// Issues a 24-hour certificate for `key` with the node CA; stored in
    /// `node_certs` when `store`, so the control plane knows it as its own.
    pub(crate) fn issue(
        &self,
        node_id: &str,
        key: &KeyPair,
        statements: &[String],
        generation: i64,
        store: bool,
    ) -> Vec<u8> {
        let now = self.now();
        let not_before = store::to_datetime(now - now.rem_euclid(1000));
        let issued = self
            .svc
            .bundle()
            .node_ca
            .issue(&NodeCertSpec {
                spki_der: &key.subject_public_key_info(),
                trust_domain: TRUST_DOMAIN,
                node_id,
                statements,
                not_before,
                not_after: not_before + time::Duration::hours(24),
            })
            .unwrap();
        if store {
            self.db()
                .write(|tx| records::insert_cert(tx, node_id, generation, &issued))
                .unwrap();
        }
        issued.der
    }
}
