//! Client certificates verified at database time.
//!
//! Every expiry the control plane decides uses the database clock
//! ([`crate::store::Tx::now`]), which `bc-controlplane clock set` moves; the
//! TLS layer must too, or a renewal would be judged by two clocks. rustls'
//! webpki verifier takes the time to verify at as an argument: this wrapper
//! passes the database's instead of the system's.
//!
//! **An expired leaf still completes the handshake.** Its chain, its
//! signature and the CA's validity are checked at the leaf's own `notAfter`,
//! so that Renew sees the caller and refuses it by name (`expired`, with its
//! `security.renew.refused` event) instead of a bare TLS alert nobody can
//! attribute. Renew is the only endpoint that trusts the TLS client identity,
//! and it checks the leaf's expiry itself at database time. A leaf not yet
//! valid at database time is refused here.
//!
//! **The clock is read per handshake**, from a connection of its own: a
//! point read of one `settings` row under WAL, which never waits for a
//! writer (tens of microseconds), and only for handshakes that present a
//! certificate (Renew), so `clock set` applies to the very next handshake.
//! A read that fails (the database locked past a short timeout) falls back to
//! the last offset read, logged, rather than stalling the handshake.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::store::{self, ClockConn, DbError, PgClock, Store, UnixMs};

/// The database clock, read on a connection of its own.
pub(crate) struct DbClock {
    source: Source,
    last_offset_ms: AtomicI64,
}

enum Source {
    /// This host's clock plus the offset read from the file.
    Sqlite(ClockConn),
    /// The server's clock plus the offset, from the clock thread (which
    /// does its own fallback).
    Pg(PgClock),
}

impl std::fmt::Debug for DbClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbClock")
            .field(
                "last_offset_ms",
                &self.last_offset_ms.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl DbClock {
    /// Opens `path` (an existing, migrated database) read-only.
    pub(crate) fn open(path: &Path) -> Result<Self, DbError> {
        let conn = ClockConn::open(path)?;
        let offset = conn.offset_ms()?;
        Ok(DbClock {
            source: Source::Sqlite(conn),
            last_offset_ms: AtomicI64::new(offset),
        })
    }

    /// The clock of `db`, whichever backend it is.
    pub(crate) fn for_store(db: &Store) -> Result<Self, DbError> {
        match (db.path(), db.pg_clock()) {
            (Some(path), _) => Self::open(path),
            (None, Some(clock)) => Ok(DbClock {
                source: Source::Pg(clock?),
                last_offset_ms: AtomicI64::new(0),
            }),
            (None, None) => Err(DbError::PgConfig(
                "the database has neither a file nor a server".to_owned(),
            )),
        }
    }

    /// The database's time now.
    pub(crate) fn now(&self) -> UnixMs {
        let conn = match &self.source {
            Source::Sqlite(conn) => conn,
            Source::Pg(clock) => return clock.now(),
        };
        let read = conn.offset_ms();
        let offset = match read {
            Ok(o) => {
                self.last_offset_ms.store(o, Ordering::Relaxed);
                o
            }
            Err(e) => {
                let last = self.last_offset_ms.load(Ordering::Relaxed);
                tracing::warn!(error = %e, offset_ms = last, "cannot read the clock offset; using the last one read");
                last
            }
        };
        store::system_now_ms().saturating_add(offset)
    }
}

/// The webpki client verifier, at database time; see the module docs.
#[derive(Debug)]
pub(crate) struct DbTimeClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    clock: DbClock,
}

impl DbTimeClientVerifier {
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, clock: DbClock) -> Self {
        DbTimeClientVerifier { inner, clock }
    }
}

/// The time to verify `leaf`'s chain at: database time, or the leaf's
/// `notAfter` when that is earlier (an expired leaf is Renew's to refuse).
/// A leaf that does not parse is verified at database time (and refused).
fn verification_time(leaf: &[u8], db_now: UnixMs) -> UnixTime {
    let now_secs = db_now.div_euclid(1000);
    let secs = match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, cert)) => now_secs.min(cert.validity().not_after.timestamp()),
        Err(_) => now_secs,
    };
    UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

impl ClientCertVerifier for DbTimeClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _system_now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let at = verification_time(end_entity, self.clock.now());
        self.inner
            .verify_client_cert(end_entity, intermediates, at)
            .inspect_err(|e| tracing::info!(error = %e, "client certificate refused"))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::test_support::both_backends!(the_clock_follows_clock_set_at_once);

    fn the_clock_follows_clock_set_at_once(backend: crate::test_support::Backend) {
        let t = crate::test_support::temp_db_on(backend);
        let clock = DbClock::for_store(&t.db).unwrap();
        let before = clock.now();
        t.db.write(|tx| store::set_clock_offset_ms(tx, 86_400_000))
            .unwrap();
        let after = clock.now();
        assert!(after - before >= 86_400_000, "{before} {after}");
    }

    #[test]
    fn an_expired_leaf_is_verified_at_its_not_after() {
        let key = crate::test_support::key();
        let mut params = rcgen::CertificateParams::default();
        params.not_before = store::to_datetime(1_000_000_000_000);
        params.not_after = store::to_datetime(1_000_086_400_000);
        let leaf = params.self_signed(&key).unwrap().der().to_vec();
        let secs = |t: UnixTime| t.as_secs();
        // Valid: database time.
        assert_eq!(
            secs(verification_time(&leaf, 1_000_000_500_000)),
            1_000_000_500
        );
        // Expired: its notAfter.
        assert_eq!(
            secs(verification_time(&leaf, 2_000_000_000_000)),
            1_000_086_400
        );
        // Not a certificate: database time.
        assert_eq!(secs(verification_time(b"junk", 5_000)), 5);
        assert_eq!(secs(verification_time(b"junk", -5_000)), 0);
    }
}
