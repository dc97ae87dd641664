//! Each check-then-write that SQLite's one writer serialises, run as two
//! concurrent transactions on PostgreSQL, as two replicas would run them
//! (docs/control-plane.md "Locks"; the `PG:` comments name each lock).
//!
//! [`race`] stops the first transaction just before its COMMIT, its writes
//! made and its locks held, until the second is either waiting on a lock or
//! has reached its own COMMIT. With the lock in place the second waits, then
//! decides on what the first committed; without it the second passes the
//! same check on the state before the first, and both win. Each test here
//! was run with its lock removed and failed. (The discovery approval's
//! races are beside its other tests, in attestors/discovery/approval.rs,
//! and a denial during a discovery join's verify in attestors/discovery.rs.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bc_wire::agent::Role;

use crate::model::enroll;
use crate::model::machine::EkAssurance;
use crate::model::sites::{self, LeaseOutcome};
use crate::model::{boot, nodes, pools, tokens};
use crate::plane::join::JoinService;
use crate::store::pg::BEFORE_COMMIT;
use crate::store::{params, DbError, Store};
use crate::test_support::{cp_on, insert_node, key, plain_csr, temp_db_on, Backend, TempDb};

/// Longer than any wait here can take on a loaded machine; only a bug
/// (a transaction that never reaches its COMMIT) runs into it.
const DEADLINE: Duration = Duration::from_secs(30);

/// Runs `a` and `b`, each on a store of its own (two replicas' pools), so
/// that `b` runs while `a`'s transaction stands uncommitted before its
/// COMMIT; returns both results.
pub(crate) fn race<A: Send, B: Send>(
    t: &TempDb,
    a: impl FnOnce(&Store) -> A + Send,
    b: impl FnOnce(&Store) -> B + Send,
) -> (A, B) {
    let (store_a, store_b) = (t.reopen(), t.reopen());
    race_polling(t.reopen(), move || a(&store_a), move || b(&store_b))
}

/// As [`race`], for `a` and `b` that bring their own database (two joins
/// through one JoinService); `poll` watches for lock waits.
fn race_polling<A: Send, B: Send>(
    poll: Store,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    let (a_at_commit, a_waiting) = mpsc::channel::<()>();
    let b_past_checks = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let b_seen = Arc::clone(&b_past_checks);
        let ha = s.spawn(move || {
            let mut first = true;
            let hook = move || {
                if !std::mem::take(&mut first) {
                    return;
                }
                let _ = a_at_commit.send(());
                let start = Instant::now();
                while !b_seen.load(Ordering::SeqCst) && lock_waiters(&poll) == 0 {
                    assert!(start.elapsed() < DEADLINE, "b neither waited nor committed");
                    std::thread::sleep(Duration::from_millis(2));
                }
            };
            BEFORE_COMMIT.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
            let out = a();
            BEFORE_COMMIT.with(|h| *h.borrow_mut() = None);
            out
        });
        let b_done = Arc::clone(&b_past_checks);
        let hb = s.spawn(move || {
            a_waiting
                .recv_timeout(DEADLINE)
                .expect("a reaches its COMMIT");
            let at_commit = Arc::clone(&b_done);
            BEFORE_COMMIT.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || at_commit.store(true, Ordering::SeqCst)))
            });
            let out = b();
            BEFORE_COMMIT.with(|h| *h.borrow_mut() = None);
            b_done.store(true, Ordering::SeqCst);
            out
        });
        (ha.join().unwrap(), hb.join().unwrap())
    })
}

/// Sessions of this test's database waiting on a lock (a row, an advisory
/// name, a unique key another transaction is inserting).
fn lock_waiters(db: &Store) -> i64 {
    db.read(|tx| {
        tx.query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            params![],
        )?
        .get(0)
    })
    .map_err(|e: DbError| e.to_string())
    .unwrap()
}

pub(crate) fn pg() -> TempDb {
    temp_db_on(Backend::Postgres)
}

const LEASE: &str = "site:s1:boot";

fn acquire(db: &Store, node: &str) -> LeaseOutcome {
    db.write(|tx| {
        let now = tx.now()?;
        sites::acquire(tx, LEASE, node, now, 60_000)
    })
    .unwrap()
}

/// A first take finds no row to lock: the `lease:` advisory lock.
#[test]
fn two_site_nodes_taking_a_new_lease_at_once_get_one_holder() {
    let t = pg();
    let (a, b) = race(&t, |db| acquire(db, "node_a"), |db| acquire(db, "node_b"));
    assert!(matches!(&a, LeaseOutcome::Held(l) if l.epoch == 1), "{a:?}");
    assert!(
        matches!(&b, LeaseOutcome::HeldByOther(l) if l.holder.as_deref() == Some("node_a") && l.epoch == 1),
        "{b:?}"
    );
}

/// A takeover after the lease lapsed raises the epoch once.
#[test]
fn two_site_nodes_taking_over_a_lapsed_lease_raise_the_epoch_once() {
    let t = pg();
    acquire(&t.db, "node_old");
    t.db.write(|tx| crate::store::set_clock_offset_ms(tx, 120_000))
        .unwrap();
    let (a, b) = race(&t, |db| acquire(db, "node_a"), |db| acquire(db, "node_b"));
    assert!(matches!(&a, LeaseOutcome::Held(l) if l.epoch == 2), "{a:?}");
    assert!(
        matches!(&b, LeaseOutcome::HeldByOther(l) if l.holder.as_deref() == Some("node_a") && l.epoch == 2),
        "{b:?}"
    );
}

/// Two policy changes of one pool keep both keys (`FOR UPDATE` on the pool).
#[test]
fn two_policy_changes_of_one_pool_at_once_keep_both() {
    let t = pg();
    pools::create_pool(&t.db, "p1", "root", None, &["join-token"]).unwrap();
    let attestors = vec!["join-token".to_owned()];
    race(
        &t,
        |db| pools::set_join_attestors(db, "p1", Some(&attestors), &["join-token"]).unwrap(),
        |db| pools::set_min_ek_assurance(db, "p1", Some(EkAssurance::Nv)).unwrap(),
    );
    let pool = t.db.read(|tx| pools::get(tx, "p1")).unwrap().unwrap();
    assert_eq!(pool.join_attestors().unwrap(), Some(attestors));
    assert_eq!(pool.min_ek_assurance().unwrap(), Some(EkAssurance::Nv));
}

/// Approve and deny of one request: one wins (`FOR UPDATE` on the request).
#[test]
fn approve_and_deny_of_one_request_at_once_decide_it_once() {
    let t = pg();
    let req =
        t.db.write(|tx| {
            enroll::insert_pending(
                tx,
                bc_wire::AttestorId::Tpm,
                &"ab".repeat(32),
                "CN=maker",
                "01",
                1,
            )
        })
        .unwrap();
    let (a, b) = race(
        &t,
        |db| enroll::approve(db, &req.id, None, None),
        |db| enroll::deny(db, &req.id),
    );
    assert_eq!(a.unwrap().status, enroll::RequestStatus::Approved);
    let e = b.unwrap_err().to_string();
    assert!(e.contains("already approved"), "{e}");
}

/// One approved request admits one machine: the second join's `mark_used`
/// finds the row used and runs again (as the tpm attestor's `place` does).
#[test]
fn an_approved_request_used_by_two_joins_at_once_is_used_once() {
    let t = pg();
    let ek = "cd".repeat(32);
    let req = t
        .db
        .write(|tx| enroll::insert_pending(tx, bc_wire::AttestorId::Tpm, &ek, "CN=maker", "01", 1))
        .unwrap();
    enroll::approve(&t.db, &req.id, None, None).unwrap();
    let use_it = |db: &Store| {
        db.write(|tx| match enroll::open_request(tx, &ek)? {
            Some(r) if r.status == enroll::RequestStatus::Approved => {
                enroll::mark_used(tx, &r.id, 2).map(|()| true)
            }
            _ => Ok(false),
        })
        .unwrap()
    };
    let (a, b) = race(&t, use_it, use_it);
    assert!(a, "the first join uses the request");
    assert!(!b, "the second finds it used");
}

/// Two raises of one node's identity generation make two generations
/// (`FOR UPDATE` on the node).
#[test]
fn two_identity_revocations_at_once_raise_the_generation_twice() {
    let t = pg();
    insert_node(&t.db, "node_r", bc_wire::AttestorId::JoinToken, 1);
    let (a, b) = race(
        &t,
        |db| nodes::revoke_identity(db, "node_r").unwrap(),
        |db| nodes::revoke_identity(db, "node_r").unwrap(),
    );
    assert_eq!((a.identity_generation, b.identity_generation), (2, 3));
}

/// Revoking a token twice keeps the first time (`FOR UPDATE` on the token).
#[test]
fn two_revocations_of_one_token_at_once_revoke_it_once() {
    let t = pg();
    let (token, _) = tokens::create_token(&t.db, Role::Node, 1, 60_000).unwrap();
    let (a, b) = race(
        &t,
        |db| tokens::revoke_token(db, &token.id).unwrap(),
        |db| tokens::revoke_token(db, &token.id).unwrap(),
    );
    assert!(matches!(a, tokens::RevokeOutcome::Revoked), "{a:?}");
    assert!(matches!(b, tokens::RevokeOutcome::AlreadyRevoked), "{b:?}");
}

/// Two sites of one name: the unique name makes the second wait, fail with
/// 23505, run again and say the name is taken.
#[test]
fn two_sites_of_one_name_at_once_create_one() {
    let t = pg();
    let (a, b) = race(
        &t,
        |db| sites::create(db, "rack-1"),
        |db| sites::create(db, "rack-1"),
    );
    assert!(a.is_ok(), "{a:?}");
    let e = b.unwrap_err().to_string();
    assert_eq!(e, "INVALID_INPUT: a site named \"rack-1\" already exists");
}

/// A boot entry hands out at most [`boot::MAX_LIVE_TOKENS`] live tokens,
/// however many get-secret calls come at once (`FOR UPDATE` on the entry).
#[test]
fn get_secret_at_once_mints_no_token_past_the_entrys_limit() {
    let t = pg();
    sites::create(&t.db, "rack-2").unwrap();
    let key = boot::BootKey::derive(&[7; 32]);
    let entry = boot::add(
        &t.db,
        &key,
        &boot::NewEntry {
            site: "rack-2",
            mac: "52:54:00:00:00:01",
            product_uuid: None,
            ek_sha256: None,
            node: None,
            ttl_ms: 3_600_000,
        },
    )
    .unwrap();
    let issue = |db: &Store| {
        db.write(|tx| {
            let now = tx.now()?;
            let e = boot::get_for_update(tx, &entry.workflow_id)?.unwrap();
            boot::issue_token(tx, &key, &e, now).map(|r| r.is_ok())
        })
        .unwrap()
    };
    // The entry's own token, then new ones up to one short of the limit.
    for _ in 0..boot::MAX_LIVE_TOKENS - 1 {
        assert!(issue(&t.db));
    }
    let (a, b) = race(&t, issue, issue);
    assert!(a, "the 32nd token is minted");
    assert!(!b, "a 33rd is not");
}

/// One machine, two provisioned tokens for its product UUID, two joins at
/// once: one node (`hw:`/`uuid:` advisory locks in JoinService::admit; no
/// unique index can say "one live holder").
#[test]
fn one_machine_joining_twice_at_once_becomes_one_node() {
    const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
    let cp = cp_on(Backend::Postgres);
    let request = || {
        let scope = tokens::TokenScope {
            expect: crate::model::machine::Expect {
                product_uuid: Some(UUID.to_owned()),
                mac: None,
            },
            ..tokens::TokenScope::default()
        };
        let (token, _) = cp
            .db()
            .write(|tx| tokens::insert_token(tx, "provisioned", 1, 60_000, &scope))
            .unwrap();
        let csr = plain_csr(&key());
        bc_wire::agent::JoinRequest {
            sealed_token: cp.seal_token(&csr, &token.expose()),
            csr,
            role: Role::Node as i32,
            attestor: "provisioned".to_owned(),
            claims: Some(bc_wire::agent::HardwareClaims {
                product_uuid: UUID.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let (req_a, req_b) = (request(), request());
    let config = crate::config::load(cp.path()).unwrap();
    let poll = Store::open_configured(cp.path(), config.database.as_ref()).unwrap();
    let (a, b) = race_polling(
        poll,
        || JoinService::new(&cp.svc).join(req_a),
        || JoinService::new(&cp.svc).join(req_b),
    );
    assert!(a.is_ok(), "{a:?}");
    assert!(
        matches!(b, Err(crate::plane::api_error::ApiError::AccessDenied)),
        "the second join of the machine is refused: {b:?}"
    );
    let nodes: i64 = cp
        .db()
        .read(|tx| {
            tx.query_one("SELECT count(*) FROM nodes", params![])?
                .get(0)
        })
        .unwrap();
    assert_eq!(nodes, 1);
    let refused: Vec<_> = crate::model::records::list_events(cp.db())
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == crate::model::records::EVENT_JOIN_REFUSED)
        .filter_map(|e| e.reason)
        .collect();
    assert_eq!(refused, [crate::model::join_reasons::JoinReason::Reclaim]);
}
