//! Boot entries: the machines a site is to commission over PXE.
//!
//! `boot add` writes an entry (site, MAC, optional product UUID, expiry) with
//! a workflow id and mints its discovery token: role `discovery`, one use,
//! that site, `expect.mac` = the MAC, expiring with the entry. Unlike every
//! other token, the site's lease holder must be able to fetch it again (it
//! puts it on the ramdisk's command line), so its text is kept here sealed
//! (AES-256-GCM, a key derived from the control plane's challenge key, the
//! workflow id as associated data): the database alone still admits nothing.
//!
//! An entry is `waiting`, then `vouched` once the lease holder fetched its
//! token, then `joined` by the node the discovery attestor admitted with it;
//! `expired` when its time passed before that.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use bc_wire::token::JoinToken;
use hmac::Mac;
use rusqlite::{OptionalExtension, Transaction};

use crate::attestor::Expect;
use crate::db::{self, Database, DbError, UnixMs};
use crate::pools::PoolError;
use crate::tokens::{self, TokenScope};

/// The role of discovery tokens: no join-token join accepts it.
pub const DISCOVERY_ROLE: &str = "discovery";

const NONCE_LEN: usize = 12;

/// The key boot entries' token texts are sealed under.
pub struct BootKey([u8; 32]);

impl BootKey {
    /// HMAC-SHA256(challenge key, label): a key of its own for this use.
    pub fn derive(challenge_key: &[u8]) -> BootKey {
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(challenge_key) else {
            // HMAC takes a key of any length.
            return BootKey([0; 32]);
        };
        mac.update(b"bc boot-entry token key v1");
        BootKey(mac.finalize().into_bytes().into())
    }

    fn seal(&self, workflow_id: &str, text: &str) -> Result<Vec<u8>, DbError> {
        let nonce: [u8; NONCE_LEN] = crate::ids::random_bytes().map_err(DbError::Random)?;
        let fail = || DbError::Corrupt {
            what: "boot entry token",
            detail: "cannot seal".to_owned(),
        };
        let cipher = Aes256Gcm::new_from_slice(&self.0).map_err(|_| fail())?;
        let sealed = cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: text.as_bytes(),
                    aad: workflow_id.as_bytes(),
                },
            )
            .map_err(|_| fail())?;
        Ok([nonce.as_slice(), &sealed].concat())
    }

    fn open(&self, workflow_id: &str, sealed: &[u8]) -> Result<String, DbError> {
        let fail = || DbError::Corrupt {
            what: "boot entry token",
            detail: format!("{workflow_id}: does not open under this control plane's key"),
        };
        if sealed.len() < NONCE_LEN {
            return Err(fail());
        }
        let (nonce, ct) = sealed.split_at(NONCE_LEN);
        let nonce = <[u8; NONCE_LEN]>::try_from(nonce).map_err(|_| fail())?;
        let cipher = Aes256Gcm::new_from_slice(&self.0).map_err(|_| fail())?;
        let plain = cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ct,
                    aad: workflow_id.as_bytes(),
                },
            )
            .map_err(|_| fail())?;
        String::from_utf8(plain).map_err(|_| fail())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootEntry {
    pub workflow_id: String,
    pub site_id: String,
    pub mac: String,
    pub product_uuid: Option<String>,
    pub token_id: String,
    pub not_after: UnixMs,
    pub created_at: UnixMs,
    pub vouched_at: Option<UnixMs>,
    pub joined_at: Option<UnixMs>,
    pub node_id: Option<String>,
}

impl BootEntry {
    /// `waiting`, `vouched`, `joined` or `expired`, at `now`.
    pub fn state(&self, now: UnixMs) -> &'static str {
        if self.joined_at.is_some() {
            "joined"
        } else if now >= self.not_after {
            "expired"
        } else if self.vouched_at.is_some() {
            "vouched"
        } else {
            "waiting"
        }
    }
}

/// What `boot add` is given (MAC and UUID already normalized).
pub struct NewEntry<'a> {
    pub site: &'a str,
    pub mac: &'a str,
    pub product_uuid: Option<&'a str>,
    pub ttl_ms: i64,
}

/// Adds a boot entry and mints its discovery token.
pub fn add(db: &Database, key: &BootKey, new: &NewEntry<'_>) -> Result<BootEntry, PoolError> {
    let workflow_id = crate::ids::random_id("wf_").map_err(DbError::Random)?;
    db.write(|tx| {
        let site_id = crate::sites::resolve(tx, new.site)?;
        let now = db::compute_now(tx)?;
        let scope = TokenScope {
            pool: None,
            expect: Expect {
                mac: Some(new.mac.to_owned()),
                product_uuid: None,
            },
            site: Some(&site_id),
            ..TokenScope::default()
        };
        let (token, row) = tokens::insert_token(tx, DISCOVERY_ROLE, 1, new.ttl_ms, &scope)?;
        let sealed = key.seal(&workflow_id, &token.expose())?;
        let entry = BootEntry {
            workflow_id: workflow_id.clone(),
            site_id,
            mac: new.mac.to_owned(),
            product_uuid: new.product_uuid.map(str::to_owned),
            token_id: row.id,
            not_after: row.expires_at,
            created_at: now,
            vouched_at: None,
            joined_at: None,
            node_id: None,
        };
        tx.execute(
            "INSERT INTO boot_entries (workflow_id, site_id, mac, product_uuid, token_id,
                                       sealed_secret, not_after, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            rusqlite::params![
                entry.workflow_id,
                entry.site_id,
                entry.mac,
                entry.product_uuid,
                entry.token_id,
                sealed,
                entry.not_after,
                entry.created_at
            ],
        )
        .map_err(DbError::from)?;
        Ok(entry)
    })
}

const SELECT: &str = "SELECT workflow_id, site_id, mac, product_uuid, token_id, not_after,
        created_at, vouched_at, joined_at, node_id FROM boot_entries";

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<BootEntry> {
    Ok(BootEntry {
        workflow_id: r.get(0)?,
        site_id: r.get(1)?,
        mac: r.get(2)?,
        product_uuid: r.get(3)?,
        token_id: r.get(4)?,
        not_after: r.get(5)?,
        created_at: r.get(6)?,
        vouched_at: r.get(7)?,
        joined_at: r.get(8)?,
        node_id: r.get(9)?,
    })
}

pub fn list(db: &Database) -> Result<Vec<BootEntry>, DbError> {
    db.with_conn(|c| {
        let mut st = c.prepare(&format!("{SELECT} ORDER BY created_at, workflow_id"))?;
        let rows = st.query_map([], read_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    })?
}

pub fn get(tx: &Transaction<'_>, workflow_id: &str) -> Result<Option<BootEntry>, DbError> {
    Ok(tx
        .query_row(
            &format!("{SELECT} WHERE workflow_id = ?1"),
            [workflow_id],
            read_row,
        )
        .optional()?)
}

/// The newest entry of `site_id` for `mac` that is neither joined nor
/// expired at `now`: the one a site boots when iPXE asks by MAC.
pub fn open_for_mac(
    tx: &Transaction<'_>,
    site_id: &str,
    mac: &str,
    now: UnixMs,
) -> Result<Option<BootEntry>, DbError> {
    Ok(tx
        .query_row(
            &format!(
                "{SELECT} WHERE site_id = ?1 AND mac = ?2 AND joined_at IS NULL AND not_after > ?3
                 ORDER BY created_at DESC, workflow_id DESC LIMIT 1"
            ),
            rusqlite::params![site_id, mac, now],
            read_row,
        )
        .optional()?)
}

/// The token of an entry for its site's lease holder; marks it vouched.
pub fn fetch_token(
    tx: &Transaction<'_>,
    key: &BootKey,
    entry: &BootEntry,
    now: UnixMs,
) -> Result<JoinToken, DbError> {
    let sealed: Vec<u8> = tx.query_row(
        "SELECT sealed_secret FROM boot_entries WHERE workflow_id = ?1",
        [&entry.workflow_id],
        |r| r.get(0),
    )?;
    let text = key.open(&entry.workflow_id, &sealed)?;
    let token = JoinToken::parse(&text).map_err(|_| DbError::Corrupt {
        what: "boot entry token",
        detail: format!("{}: not a token", entry.workflow_id),
    })?;
    tx.execute(
        "UPDATE boot_entries SET vouched_at = ?2 WHERE workflow_id = ?1 AND vouched_at IS NULL",
        rusqlite::params![entry.workflow_id, now],
    )?;
    Ok(token)
}

/// Records that `node_id` joined with the entry whose token is `token_id`.
pub fn mark_joined(
    tx: &Transaction<'_>,
    token_id: &str,
    node_id: &str,
    now: UnixMs,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE boot_entries SET joined_at = ?2, node_id = ?3 WHERE token_id = ?1",
        rusqlite::params![token_id, now, node_id],
    )?;
    Ok(())
}
