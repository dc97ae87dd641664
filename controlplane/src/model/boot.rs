//! Boot entries: the machines a site is to commission over PXE.
//!
//! `boot add` writes an entry (site, MAC, optional product UUID, expiry) with
//! a workflow id and mints its discovery token: role `discovery`, one use,
//! that site, `expect.mac` = the MAC and `expect.productUuid` = the entry's
//! UUID when it has one, expiring with the entry. Unlike every other token,
//! the site's lease holder must be able to fetch it (it puts it on the
//! ramdisk's command line), so its text is kept here sealed (AES-256-GCM, a
//! key derived from the control plane's challenge key, the workflow id as
//! associated data): the database alone still admits nothing.
//!
//! The entry is spent by a join, not by a request: the first SecretRequest
//! gets that token, every later one a new single-use token of the same
//! binding ([`issue_token`], at most [`MAX_LIVE_TOKENS`] unspent at once),
//! so a neighbour on the boot LAN that fetched the machine's script first
//! takes nothing from it: its refused join leaves the entry open. The join
//! one of them admits closes the entry and revokes the others
//! ([`mark_joined`]).
//!
//! Who may answer for an entry: with an expected EK (`boot add
//! --ek-sha256`, or `--node N`: re-commissioning N, whose bound EK and
//! trusted product UUID the entry takes), only a discovery join proving
//! that EK with its TPM; without one, whoever the site vouches for (the
//! boot LAN is trusted). See [`crate::attestors::discovery`].
//!
//! An entry is `waiting`, then `vouched` once the lease holder fetched a
//! token, then `joined` by the node the discovery attestor admitted with it;
//! `expired` when its time passed before that. A ramdisk node lives no
//! longer than its entry ([`cert_not_after`]) and is retired when a later
//! entry of the same machine joins or its own entry expired
//! ([`retire_superseded`]).

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use bc_wire::token::JoinToken;
use hmac::Mac;

use crate::model::machine::Expect;
use crate::model::pools::PoolError;
use crate::model::records::{self, NewEvent};
use crate::model::tokens::{self, TokenScope};
use crate::store::{params, DbError, Row, Store, Tx, UnixMs};

/// The role of discovery tokens: no join-token join accepts it.
pub(crate) const DISCOVERY_ROLE: &str = "discovery";

/// Unspent, unrevoked tokens one entry may have at once. Each boot script
/// gets one; a machine retrying its PXE boot needs a few, a flood of
/// requests for its MAC gets refused past this rather than filling the
/// token table (the tokens expire with the entry).
pub(crate) const MAX_LIVE_TOKENS: i64 = 32;

/// The most open entries [`list_open`] answers (newest first): about
/// 100 bytes each, well under the 1 MiB an agent reads of an answer. A site
/// with more open entries boots only its newest ones.
pub(crate) const MAX_LISTED: i64 = 4096;

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

    /// Seals `text` bound to `workflow_id` (the associated data; a deploy
    /// seed's is `deploy-seed:<node id>`, never a workflow id).
    pub(crate) fn seal(&self, workflow_id: &str, text: &str) -> Result<Vec<u8>, DbError> {
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

    pub(crate) fn open(&self, workflow_id: &str, sealed: &[u8]) -> Result<String, DbError> {
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
    /// The EK only a join proving it may answer for this entry (lowercase
    /// hex SHA-256 of its SPKI); `None`: no TPM is expected.
    pub ek_sha256: Option<String>,
    pub token_id: String,
    pub not_after: UnixMs,
    pub created_at: UnixMs,
    pub(crate) vouched_at: Option<UnixMs>,
    pub joined_at: Option<UnixMs>,
    pub node_id: Option<String>,
}

impl BootEntry {
    /// The EK an operator bound this entry's machine to (`boot add
    /// --ek-sha256`, or `--node`'s bound EK): only a join proving it is
    /// admitted, and `[discovery] approval` does not apply to it.
    pub(crate) fn expected_ek(&self) -> Option<&str> {
        self.ek_sha256.as_deref()
    }

    /// Where the entry is at `now`.
    pub fn state(&self, now: UnixMs) -> BootState {
        if self.joined_at.is_some() {
            BootState::Joined
        } else if now >= self.not_after {
            BootState::Expired
        } else if self.vouched_at.is_some() {
            BootState::Vouched
        } else {
            BootState::Waiting
        }
    }
}

/// Where a boot entry is, from its row and the time (not stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootState {
    Waiting,
    Vouched,
    Joined,
    Expired,
}

impl BootState {
    /// As `boot list` and the events print it.
    pub fn as_str(self) -> &'static str {
        match self {
            BootState::Waiting => "waiting",
            BootState::Vouched => "vouched",
            BootState::Joined => "joined",
            BootState::Expired => "expired",
        }
    }

    /// No join waits on the entry any more.
    pub(crate) fn is_closed(self) -> bool {
        matches!(self, BootState::Joined | BootState::Expired)
    }
}

impl std::fmt::Display for BootState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `boot add` is given (MAC and UUID already normalized).
pub struct NewEntry<'a> {
    pub site: &'a str,
    pub mac: &'a str,
    pub product_uuid: Option<&'a str>,
    /// The EK the machine must prove (64 hex digits, any case).
    pub ek_sha256: Option<&'a str>,
    /// Re-commissioning this node: the entry expects its bound EK and its
    /// trusted product UUID.
    pub node: Option<&'a str>,
    pub ttl_ms: i64,
}

/// The expectation `--node` gives an entry: the node's bound EK, and its
/// trusted product UUID when it has one. A node that is not there, is
/// retired or proved no EK is an error naming it.
fn node_expectation(tx: &Tx<'_>, node: &str) -> Result<(String, Option<String>), PoolError> {
    let row = records::node_for_update(tx, node)?.ok_or_else(|| {
        PoolError::InvalidInput(format!(
            "--node {node:?}: no such node (deleted or never joined)"
        ))
    })?;
    if row.retired_at.is_some() {
        return Err(PoolError::InvalidInput(format!(
            "--node {node}: the node is retired; re-commission a live node, or use --ek-sha256"
        )));
    }
    let ek = records::binding_of_node(tx, node, crate::model::machine::BINDING_TPM_EK)?.ok_or_else(
        || {
            PoolError::InvalidInput(format!(
                "--node {node}: the node is bound to no EK (it never joined with its TPM); use --ek-sha256 from bcd tpm identify --json, or no expectation"
            ))
        },
    )?;
    Ok((
        ek.key,
        crate::model::hardware::proven_product_uuid(tx, node)?,
    ))
}

/// Adds a boot entry and mints its discovery token.
pub fn add(db: &Store, key: &BootKey, new: &NewEntry<'_>) -> Result<BootEntry, PoolError> {
    let workflow_id = crate::ids::random_id("wf_").map_err(DbError::Random)?;
    db.write(|tx| add_in(tx, key, new, &workflow_id))
}

/// [`add`] in the caller's transaction (a workflow's start), under the id
/// `workflow_id`.
pub(crate) fn add_in(
    tx: &Tx<'_>,
    key: &BootKey,
    new: &NewEntry<'_>,
    workflow_id: &str,
) -> Result<BootEntry, PoolError> {
    let workflow_id = workflow_id.to_owned();
    let given_ek = new
        .ek_sha256
        .map(crate::model::machine::EkSha256::parse)
        .transpose()
        .map_err(|e| PoolError::InvalidInput(e.to_string()))?
        .map(crate::model::machine::EkSha256::into_string);
    {
        let site_id = crate::model::sites::resolve(tx, new.site)?;
        let now = tx.now()?;
        let mut product_uuid = new.product_uuid.map(str::to_owned);
        let mut ek_sha256 = given_ek.clone();
        if let Some(node) = new.node {
            let (ek, uuid) = node_expectation(tx, node)?;
            if ek_sha256.as_ref().is_some_and(|given| *given != ek) {
                return Err(PoolError::InvalidInput(format!(
                    "--ek-sha256 is not the EK {node} is bound to ({ek})"
                )));
            }
            if let (Some(given), Some(bound)) = (&product_uuid, &uuid) {
                if given != bound {
                    return Err(PoolError::InvalidInput(format!(
                        "--product-uuid {given} is not {node}'s ({bound})"
                    )));
                }
            }
            ek_sha256 = Some(ek);
            product_uuid = product_uuid.or(uuid);
        }
        let mut entry = BootEntry {
            workflow_id: workflow_id.clone(),
            site_id,
            mac: new.mac.to_owned(),
            product_uuid,
            ek_sha256,
            token_id: String::new(),
            not_after: now.saturating_add(new.ttl_ms),
            created_at: now,
            vouched_at: None,
            joined_at: None,
            node_id: None,
        };
        let (token, row) = mint(tx, &entry, new.ttl_ms)?;
        let sealed = key.seal(&workflow_id, &token.expose())?;
        entry.token_id = row.id;
        entry.not_after = row.expires_at;
        tx.execute(
            "INSERT INTO boot_entries (workflow_id, site_id, mac, product_uuid, token_id,
                                       sealed_secret, not_after, created_at, ek_sha256)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                entry.workflow_id,
                entry.site_id,
                entry.mac,
                entry.product_uuid,
                entry.token_id,
                sealed,
                entry.not_after,
                entry.created_at,
                entry.ek_sha256
            ],
        )?;
        link_token(tx, &entry.token_id, &entry.workflow_id, now)?;
        Ok(entry)
    }
}

/// Closes an entry no join answered yet (its end set to `now`) and revokes
/// its unspent tokens: a workflow that no longer waits for a join
/// (cancelled, failed, or past its ramdisk) leaves nothing on the boot LAN.
pub(crate) fn close(tx: &Tx<'_>, workflow_id: &str, now: UnixMs) -> Result<(), DbError> {
    tx.execute(
        "UPDATE boot_entries SET not_after = ?2
         WHERE workflow_id = ?1 AND joined_at IS NULL AND not_after > ?2",
        params![workflow_id, now],
    )?;
    tx.execute(
        "UPDATE join_tokens SET revoked_at = ?2
         WHERE revoked_at IS NULL AND uses_left > 0
           AND id IN (SELECT token_id FROM boot_tokens WHERE workflow_id = ?1)",
        params![workflow_id, now],
    )?;
    Ok(())
}

/// A new single-use discovery token bound as the entry is: its site, its
/// MAC and (when it has one) its product UUID, living `ttl_ms`.
fn mint(
    tx: &Tx<'_>,
    entry: &BootEntry,
    ttl_ms: i64,
) -> Result<(JoinToken, tokens::TokenRow), PoolError> {
    let scope = TokenScope {
        pool: None,
        expect: Expect {
            mac: Some(entry.mac.clone()),
            product_uuid: entry.product_uuid.clone(),
        },
        site: Some(&entry.site_id),
        ..TokenScope::default()
    };
    tokens::insert_token(tx, DISCOVERY_ROLE, 1, ttl_ms, &scope)
}

fn link_token(tx: &Tx<'_>, token_id: &str, workflow_id: &str, now: UnixMs) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO boot_tokens (token_id, workflow_id, created_at) VALUES (?1, ?2, ?3)",
        params![token_id, workflow_id, now],
    )?;
    Ok(())
}

const SELECT: &str = "SELECT workflow_id, site_id, mac, product_uuid, token_id, not_after,
        created_at, vouched_at, joined_at, node_id, ek_sha256 FROM boot_entries";

fn read_row(r: &Row) -> Result<BootEntry, DbError> {
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
        ek_sha256: r.get(10)?,
    })
}

pub fn list(db: &Store) -> Result<Vec<BootEntry>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map(
            &format!("{SELECT} ORDER BY created_at, workflow_id"),
            params![],
            read_row,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    })
}

pub(crate) fn get(tx: &Tx<'_>, workflow_id: &str) -> Result<Option<BootEntry>, DbError> {
    get_locked(tx, workflow_id, "")
}

/// As [`get`], the entry's row locked until commit: a get-secret checks the
/// entry (open, fewer than 32 live tokens) and then mints (PG: `FOR UPDATE`).
pub(crate) fn get_for_update(tx: &Tx<'_>, workflow_id: &str) -> Result<Option<BootEntry>, DbError> {
    get_locked(tx, workflow_id, tx.dialect().for_update())
}

fn get_locked(tx: &Tx<'_>, workflow_id: &str, lock: &str) -> Result<Option<BootEntry>, DbError> {
    tx.query_opt_map(
        &format!("{SELECT} WHERE workflow_id = ?1{lock}"),
        params![workflow_id],
        read_row,
    )
}

/// The open entries of a site (neither joined nor expired at `now`),
/// newest first, at most [`MAX_LISTED`]: what its boot server answers from.
pub(crate) fn list_open(
    tx: &Tx<'_>,
    site_id: &str,
    now: UnixMs,
) -> Result<Vec<BootEntry>, DbError> {
    let rows = tx.query_map(
        &format!(
            "{SELECT} WHERE site_id = ?1 AND joined_at IS NULL AND not_after > ?2
         ORDER BY created_at DESC, workflow_id DESC LIMIT ?3"
        ),
        params![site_id, now, MAX_LISTED],
        read_row,
    )?;
    rows.collect::<Result<Vec<_>, _>>()
}

/// A site's open entries, and how many of them expect an EK (admit only
/// that machine's TPM): what lease answers tell site nodes.
pub(crate) fn open_counts(
    tx: &Tx<'_>,
    site_id: &str,
    now: UnixMs,
) -> Result<(usize, usize), DbError> {
    let open = list_open(tx, site_id, now)?;
    let bound = open.iter().filter(|e| e.expected_ek().is_some()).count();
    Ok((open.len(), bound))
}

/// Why [`issue_token`] gave no token.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoToken {
    /// [`MAX_LIVE_TOKENS`] unspent tokens of the entry are live.
    TooMany,
}

/// A token of an open entry for its site's lease holder, one per boot
/// script: the entry's own token the first time, a new one of the same
/// binding after (expiring with the entry). Marks the entry vouched.
pub(crate) fn issue_token(
    tx: &Tx<'_>,
    key: &BootKey,
    entry: &BootEntry,
    now: UnixMs,
) -> Result<Result<JoinToken, NoToken>, PoolError> {
    let token = if entry.vouched_at.is_none() {
        let sealed: Vec<u8> = tx
            .query_one(
                "SELECT sealed_secret FROM boot_entries WHERE workflow_id = ?1",
                params![&entry.workflow_id],
            )
            .and_then(|r| r.get(0))?;
        let text = key.open(&entry.workflow_id, &sealed)?;
        JoinToken::parse(&text).map_err(|_| DbError::Corrupt {
            what: "boot entry token",
            detail: format!("{}: not a token", entry.workflow_id),
        })?
    } else {
        let live: i64 = tx
            .query_one(
                "SELECT count(*) FROM boot_tokens b JOIN join_tokens t ON t.id = b.token_id
                 WHERE b.workflow_id = ?1 AND t.uses_left > 0 AND t.revoked_at IS NULL
                   AND t.expires_at > ?2",
                params![entry.workflow_id, now],
            )
            .and_then(|r| r.get(0))?;
        if live >= MAX_LIVE_TOKENS {
            return Ok(Err(NoToken::TooMany));
        }
        let (token, row) = mint(tx, entry, entry.not_after.saturating_sub(now))?;
        link_token(tx, &row.id, &entry.workflow_id, now)?;
        token
    };
    tx.execute(
        "UPDATE boot_entries SET vouched_at = ?2 WHERE workflow_id = ?1 AND vouched_at IS NULL",
        params![entry.workflow_id, now],
    )?;
    Ok(Ok(token))
}

/// The entry a discovery token belongs to.
pub(crate) fn entry_of_token(tx: &Tx<'_>, token_id: &str) -> Result<Option<BootEntry>, DbError> {
    // PG: `FOR UPDATE`: one entry, one join (two ramdisks of one entry).
    tx.query_opt_map(
        &format!(
            "{SELECT} WHERE workflow_id = (SELECT workflow_id FROM boot_tokens WHERE token_id = ?1){}",
            tx.dialect().for_update()
        ),
        params![token_id],
        read_row,
    )
}

/// Records that `node_id` joined with the entry `token_id` belongs to, and
/// revokes the entry's other tokens: one entry, one join.
pub(crate) fn mark_joined(
    tx: &Tx<'_>,
    token_id: &str,
    node_id: &str,
    now: UnixMs,
) -> Result<(), DbError> {
    let Some(entry) = entry_of_token(tx, token_id)? else {
        return Ok(());
    };
    tx.execute(
        "UPDATE boot_entries SET joined_at = ?2, node_id = ?3 WHERE workflow_id = ?1",
        params![entry.workflow_id, now, node_id],
    )?;
    tx.execute(
        "UPDATE join_tokens SET revoked_at = ?2
         WHERE revoked_at IS NULL AND id != ?3
           AND id IN (SELECT token_id FROM boot_tokens WHERE workflow_id = ?1)",
        params![entry.workflow_id, now, token_id],
    )?;
    Ok(())
}

/// The latest a ramdisk node's certificate may last: the end of the boot
/// entry it joined with last (a deploy's ramdisk joins as a node an earlier
/// entry admitted; `None` for a node no entry admitted).
pub(crate) fn cert_not_after(tx: &Tx<'_>, node_id: &str) -> Result<Option<UnixMs>, DbError> {
    Ok(tx
        .query_opt_map(
            "SELECT not_after FROM boot_entries WHERE node_id = ?1
             ORDER BY joined_at DESC, created_at DESC LIMIT 1",
            params![node_id],
            |r| r.get::<Option<UnixMs>>(0),
        )?
        .flatten())
}

/// Retires the live ramdisk nodes that `entry`'s join supersedes, so that
/// none of them blocks it: those admitted by an earlier entry of the same
/// site and MAC (an earlier commissioning of this machine), those whose
/// trusted hardware key is `hardware_key` (the same operator-bound UUID),
/// and those whose own entry has expired unless a workflow commissioned
/// them (that machine waits as its ramdisk node for its deploy); never
/// `keep` (the node a deploy's ramdisk joins as). Returns how many.
pub(crate) fn retire_superseded(
    tx: &Tx<'_>,
    entry: &BootEntry,
    hardware_key: Option<&str>,
    keep: Option<&str>,
    now: UnixMs,
) -> Result<usize, DbError> {
    let ids = tx
        .query_map(
            "SELECT id FROM nodes
         WHERE role = 'ramdisk' AND retired_at IS NULL AND deleted_at IS NULL
           AND id IS DISTINCT FROM CAST(?5 AS TEXT) AND (
               id IN (SELECT node_id FROM boot_entries
                      WHERE node_id IS NOT NULL
                        AND ((site_id = ?1 AND mac = ?2)
                          OR (not_after <= ?4 AND node_id NOT IN
                                (SELECT node_id FROM workflows WHERE node_id IS NOT NULL))))
            OR (CAST(?3 AS TEXT) IS NOT NULL AND hardware_key = ?3))",
            params![entry.site_id, entry.mac, hardware_key, now, keep],
            |r| r.get::<String>(0),
        )?
        .collect::<Result<Vec<_>, _>>()?;
    for id in &ids {
        tx.execute(
            "UPDATE nodes SET retired_at = ?2 WHERE id = ?1",
            params![id, now],
        )?;
        records::insert_event(
            tx,
            &NewEvent {
                kind: records::EVENT_NODE_RETIRED,
                at: now,
                attestor: None,
                reason: Some("superseded"),
                token_id: None,
                node_id: Some(id),
                data: serde_json::json!({ "supersededBy": entry.workflow_id }),
                ..NewEvent::default()
            },
        )?;
        tracing::info!(node_id = %id, workflow = %entry.workflow_id, "ramdisk node retired: superseded by a later commissioning or its entry closed");
    }
    Ok(ids.len())
}
