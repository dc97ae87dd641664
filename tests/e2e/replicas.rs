//! Several `serve` processes on one PostgreSQL database (issue 21): what a
//! replica decides is what the database holds, never what another replica
//! keeps in memory. Each test starts a control plane on a fresh database of
//! the tests' real PostgreSQL server and one or two replicas of it
//! ([`ControlPlane::replica`]: DIR's keys and config, the same database).

use std::io::Write as _;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::Barrier;

use bc_wire::agent::JoinRequest;

use crate::harness::*;
use crate::joinproxy::{is_answer, Answer, RoutingProxy};

/// A control plane on PostgreSQL and `n` more replicas of it.
fn replicated(n: usize) -> (ControlPlane, Vec<ControlPlane>) {
    let a = ControlPlane::start_on(Backend::Postgres);
    let others = (0..n).map(|_| a.replica()).collect();
    (a, others)
}

/// The token's `usesLeft`, as `token list` shows it.
fn uses_left(cp: &ControlPlane, token: &str) -> i64 {
    let id = token.split('.').next().expect("a token id");
    let tokens = cp.json(&["token", "list"]);
    tokens
        .as_array()
        .expect("a list")
        .iter()
        .find(|t| t["id"] == id)
        .unwrap_or_else(|| panic!("token {id} is not listed: {tokens}"))["usesLeft"]
        .as_i64()
        .expect("usesLeft")
}

/// One-use token, two `bcd join` at once, one per replica: the use is spent
/// once, whichever replica comes second refuses with the token's reason.
#[test]
fn a_one_use_token_used_at_once_on_two_replicas_is_spent_once() {
    let (a, b) = replicated(1);
    let b = &b[0];
    let token = a.token("node", &["--uses", "1"]);
    let agents = [Agent::new(&a), Agent::new(b)];
    let start = Barrier::new(agents.len());
    let outputs: Vec<_> = std::thread::scope(|s| {
        let joins: Vec<_> = agents
            .iter()
            .map(|agent| {
                // Written before the barrier, so both processes start together.
                let cmd = agent.token_join(&token, &[]);
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    output_within(cmd, DEADLINE)
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("a join thread"))
            .collect()
    });
    let joined: Vec<usize> = (0..2).filter(|&i| outputs[i].status.success()).collect();
    assert_eq!(joined.len(), 1, "exactly one join succeeds: {outputs:?}");
    let refused = 1 - joined[0];
    assert_access_denied(&outputs[refused]);
    agents[refused].assert_nothing_written();
    // The shared database saw one join and one refusal, whichever replica
    // is asked.
    for cp in [&a, b] {
        assert_eq!(cp.nodes().len(), 1);
        assert_eq!(cp.refusal_reasons(), ["token-exhausted"]);
        assert_eq!(uses_left(cp, &token), 0);
    }
    let node_id = agents[joined[0]].status_json()["nodeId"]
        .as_str()
        .expect("nodeId")
        .to_owned();
    let (winner, loser) = if joined[0] == 0 { (&a, b) } else { (b, &a) };
    assert!(winner.log().contains(&node_id), "{}", winner.log());
    assert!(
        loser.log().contains("token-exhausted"),
        "the refusing replica logs the reason: {}",
        loser.log()
    );
}

/// Round 1 (the hello) to upstream 0, round 2 (the answer) to upstream 1.
fn hello_to_0_answer_to_1(req: &JoinRequest) -> Vec<usize> {
    vec![usize::from(is_answer(req))]
}

/// Round 1 to upstream 0, round 2 to upstreams 0 and 1 at once: the same
/// answer bytes replayed concurrently.
fn answer_to_both(req: &JoinRequest) -> Vec<usize> {
    if is_answer(req) {
        vec![0, 1]
    } else {
        vec![0]
    }
}

const CHALLENGE_SENT: &str = "tpm: EK verified, credential challenge sent";
const NODE_JOINED: &str = "node joined";

/// Round 2's state travels sealed under DIR/challenge.key, which replicas
/// share, and its single use is a database row: replica B finishes the join
/// replica A started, and A never hears of round 2.
#[test]
fn a_tpm_join_started_on_one_replica_finishes_on_another() {
    let a = ControlPlane::start_trusting_test_maker_on(Backend::Postgres, "");
    let b = a.replica();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&a, &tpm);
    agent.allow_ek(&a);
    let proxy = RoutingProxy::start(&[&a, &b], &agent, hello_to_0_answer_to_1);
    agent.set_api(&proxy.url);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(
        proxy.routed(),
        [vec![(0, true)], vec![(1, true)]],
        "round 1 went to A, round 2 to B"
    );
    let node_id = agent.status_json()["nodeId"]
        .as_str()
        .expect("nodeId")
        .to_owned();

    let (log_a, log_b) = (a.log(), b.log());
    let count = |log: &str, needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(
        count(&log_a, CHALLENGE_SENT),
        1,
        "A sent the challenge: {log_a}"
    );
    assert_eq!(count(&log_b, CHALLENGE_SENT), 0, "B sent none: {log_b}");
    assert_eq!(count(&log_a, NODE_JOINED), 0, "A admitted nothing: {log_a}");
    assert!(
        log_b
            .lines()
            .any(|l| l.contains(NODE_JOINED) && l.contains(&node_id)),
        "B admitted the node: {log_b}"
    );
    assert_eq!(a.nodes().len(), 1);
    // The node is the database's: it renews through A.
    agent.set_api(&a.url);
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));
}

/// The same round-2 answer sent at once to both replicas: its single use is
/// a database row, so one admits the node and the other refuses the replay
/// as `challenge-reused`.
#[test]
fn a_tpm_answer_replayed_concurrently_to_two_replicas_is_admitted_once() {
    let a = ControlPlane::start_trusting_test_maker_on(Backend::Postgres, "");
    let b = a.replica();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&a, &tpm);
    agent.allow_ek(&a);
    let proxy = RoutingProxy::start(&[&a, &b], &agent, answer_to_both);
    agent.set_api(&proxy.url);
    let out = a.refused_once(Refusal::Join("tpm"), "challenge-reused", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_ok(&out);
    let routed = proxy.routed();
    assert_eq!(routed.len(), 2, "{routed:?}");
    let admitted: Vec<usize> = routed[1].iter().filter(|r| r.1).map(|r| r.0).collect();
    assert_eq!(
        admitted.len(),
        1,
        "one replica admits the answer: {routed:?}"
    );
    let refuser = if admitted[0] == 0 { &b } else { &a };
    assert!(
        refuser
            .log()
            .lines()
            .any(|l| l.contains("join refused") && l.contains("challenge-reused")),
        "{}",
        refuser.log()
    );
    let joined = a
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.joined")
        .count();
    assert_eq!(joined, 1);
    assert_eq!(a.nodes().len(), 1);
}

/// Every Join to upstreams 0 and 1 at once: the same bytes, concurrently.
fn to_both(_: &JoinRequest) -> Vec<usize> {
    vec![0, 1]
}

/// One `bcd join --attestor x509pop`, its Join sent at once to both
/// replicas: the proof's single use is an `attestation_uses` row, so one
/// replica reclaims the node and the other refuses the replay as
/// `replayed` (ACCESS_DENIED to the client); the node moves on by one
/// identity generation, not two.
#[test]
fn an_x509pop_proof_replayed_concurrently_to_two_replicas_is_admitted_once() {
    let (a, b) = replicated(1);
    let b = &b[0];
    let pg = a.pg.clone().expect("on PostgreSQL");
    let agent = Agent::new(&a);
    assert_ok(&agent.join_with_token(&a.token("node", &[])));
    let node_id = agent.status_json()["nodeId"]
        .as_str()
        .expect("nodeId")
        .to_owned();

    let proxy = RoutingProxy::start(&[&a, b], &agent, to_both);
    agent.set_api(&proxy.url);
    let out = a.refused_once(Refusal::Join("x509pop"), "replayed", || {
        agent.run(&["join", "--attestor", "x509pop"])
    });
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), format!("re-joined as {node_id}"));
    let outcomes = proxy.outcomes();
    assert_eq!(outcomes.len(), 1, "bcd sent one Join: {outcomes:?}");
    let answered = |answer: Answer| -> Vec<usize> {
        outcomes[0]
            .iter()
            .filter(|(_, a)| *a == answer)
            .map(|(i, _)| *i)
            .collect()
    };
    let (admitted, denied) = (answered(Answer::Ok), answered(Answer::AccessDenied));
    assert_eq!(admitted.len(), 1, "one replica admits: {outcomes:?}");
    assert_eq!(
        denied.len(),
        1,
        "the other says ACCESS_DENIED: {outcomes:?}"
    );
    let (admitter, refuser) = if admitted[0] == 0 { (&a, b) } else { (b, &a) };

    const PROVED: &str = "x509pop: the node proved its last certificate";
    let (log_in, log_out) = (admitter.log(), refuser.log());
    assert!(
        log_in
            .lines()
            .any(|l| l.contains(PROVED) && l.contains(&node_id)),
        "{log_in}"
    );
    assert!(!log_out.contains(PROVED), "{log_out}");
    assert!(
        log_out.lines().any(|l| l.contains("join refused")
            && l.contains("reason=replayed")
            && l.contains(&node_id)),
        "the refusing replica logs the replay: {log_out}"
    );
    assert_eq!(a.refusal("replayed")["nodeId"], node_id.as_str());

    // One reclaim, one use: the database is the same from either replica.
    assert_eq!(
        pg.psql("SELECT count(*) FROM attestation_uses WHERE attestor = 'x509pop'"),
        "1"
    );
    for cp in [&a, b] {
        let nodes = cp.nodes();
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        assert_eq!(nodes[0]["nodeId"], node_id.as_str());
        assert_eq!(nodes[0]["attestor"], "x509pop");
        assert_eq!(nodes[0]["identityGeneration"], 2);
        let rejoins = cp
            .events()
            .into_iter()
            .filter(|e| e["type"] == "node.joined" && e["attestor"] == "x509pop")
            .count();
        assert_eq!(rejoins, 1);
    }
    // The certificate bcd kept is the admitted one: it renews through the
    // replica that refused.
    agent.set_api(&refuser.url);
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));
    assert_eq!(agent.status_json()["nodeId"], node_id.as_str());
}

/// `clock set` moves the database's clock, which every replica reads (the
/// TLS verifier's and `Tx::now`): past the certificate's expiry, both
/// refuse the renewal as `expired`, though their system clocks never moved.
#[test]
fn the_database_clock_is_every_replicas_clock() {
    let (a, b) = replicated(1);
    let b = &b[0];
    let agent = Agent::new(&a);
    assert_ok(&agent.join_with_token(&a.token("node", &[])));
    // Before: B renews what A issued.
    agent.set_api(&b.url);
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));

    // Set through B's CLI; A's handshakes and Renew see it too.
    assert_ok(&b.cli(&["clock", "set", "--offset", "25h"]));
    for cp in [&a, b] {
        agent.set_api(&cp.url);
        let out = cp.refused_once(Refusal::Renew, "expired", || {
            agent.run(&["node", "--once", "--renew-now"])
        });
        assert_renew_refused(&out);
        let log = cp.log();
        assert!(
            log.lines()
                .any(|l| l.contains("renew refused") && l.contains("expired")),
            "{log}"
        );
    }
}

/// The test's own session on the control plane's database.
struct PsqlSession {
    child: Child,
    stdin: ChildStdin,
    /// Read by a thread: a wait for a line has a deadline even while
    /// psql prints nothing.
    out: Lines,
}

impl PsqlSession {
    fn start(pg: &crate::pg_cluster::PgDb) -> Self {
        let mut child = pg
            .psql_session()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start psql");
        let stdin = child.stdin.take().expect("psql stdin");
        let out = Lines::read(child.stdout.take().expect("psql stdout"));
        PsqlSession { child, stdin, out }
    }

    /// Runs `sql`, then waits (under [`LINE_DEADLINE`]) for the line
    /// `marker` it ends by selecting: the statements before it have run.
    fn run(&mut self, sql: &str, marker: &str) {
        writeln!(self.stdin, "{sql}\nSELECT '{marker}';").expect("write to psql");
        self.stdin.flush().expect("flush psql");
        let deadline = std::time::Instant::now() + LINE_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.out.next_line(left) {
                Some(line) if line.trim() == marker => return,
                Some(_) => {}
                None => panic!(
                    "psql did not print {marker} within {LINE_DEADLINE:?} (or ended): {:?}",
                    self.out.seen
                ),
            }
        }
    }
}

impl Drop for PsqlSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kill -9` of a replica in the middle of a join's transaction: the test's
/// session holds `events` locked, so A's join blocks at its last statement
/// (the `node.joined` event) with the node, its certificate and the token's
/// use already written in its transaction. A dies there; the server rolls
/// the transaction back when A's connection is found gone: nothing of the
/// join is left, the token is unspent, and B admits the machine.
#[test]
fn kill_9_of_a_replica_mid_join_leaves_nothing_half_written() {
    let (mut a, b) = replicated(1);
    let b = &b[0];
    let pg = a.pg.clone().expect("on PostgreSQL");
    let token = a.token("node", &["--uses", "1"]);
    let agent = Agent::new(&a);
    let events_before = pg.psql("SELECT count(*) FROM events");

    let mut lock = PsqlSession::start(&pg);
    lock.run("BEGIN; LOCK TABLE events IN EXCLUSIVE MODE;", "locked");
    let join = agent.token_join(&token, &[]);
    let out = std::thread::scope(|s| {
        let joining = s.spawn(move || output_within(join, DEADLINE));
        // A's backend waiting on the lock: its join is at its last statement.
        let backend = wait_for(|| {
            let pid = pg.psql(
                "SELECT pid FROM pg_locks WHERE NOT granted \
                 AND relation = 'events'::regclass LIMIT 1",
            );
            (!pid.is_empty()).then_some(pid)
        });
        a.kill9();
        // Released, A's blocked INSERT runs; the backend then finds its
        // client gone instead of a COMMIT, and rolls back.
        lock.run("COMMIT;", "released");
        wait_for(|| {
            let n = pg.psql(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {backend}"
            ));
            (n == "0").then_some(())
        });
        joining.join().expect("the join thread")
    });
    assert!(!out.status.success(), "A died mid-join: {}", stdout(&out));
    agent.assert_nothing_written();
    assert!(
        !a.log().contains(NODE_JOINED),
        "A never finished: {}",
        a.log()
    );

    // Nothing committed: no node, certificate, join or event; the use is back.
    for table in ["nodes", "node_certs", "node_bindings", "joins"] {
        assert_eq!(
            pg.psql(&format!("SELECT count(*) FROM {table}")),
            "0",
            "{table}"
        );
    }
    assert_eq!(pg.psql("SELECT count(*) FROM events"), events_before);
    assert_eq!(uses_left(b, &token), 1);

    agent.set_api(&b.url);
    assert_ok(&agent.join_with_token(&token));
    assert_eq!(b.nodes().len(), 1);
    assert_eq!(uses_left(b, &token), 0);
}

/// A site's boot lease is a database row: held and renewed through A, taken
/// over through B with a higher epoch once it lapses (database time), after
/// which A's holder is fenced on A and an assertion under the old epoch is
/// refused by either replica. (Machines and their fake sysfs: failpoints.)
#[cfg(feature = "failpoints")]
#[test]
fn a_site_lease_renewed_on_one_replica_is_taken_over_on_another_with_a_higher_epoch() {
    use crate::discovery::{
        assert_refused_as, assert_site_refused, block_on, boot_add, cmdline, now_ms, site, Machine,
        SiteNode, MAC, UUID,
    };
    let (a, b) = replicated(1);
    let b = &b[0];
    let site_id = site(&a, "dc1");
    let on_a = SiteNode::join(&a, &site_id);
    let on_b = SiteNode::join(b, &site_id);
    let lease = on_a.acquire().expect("acquire on A");
    assert!(lease.held);
    let epoch = lease.epoch;
    block_on(on_a.client().renew_lease(&site_id, epoch)).expect("renewed on A");
    assert!(!on_b.acquire().expect("acquire on B").held, "A holds it");

    // A's holder stops renewing; 31 s of database time later, B takes over.
    assert_ok(&b.cli(&["clock", "set", "--offset", "31s"]));
    let taken = on_b.acquire().expect("acquire on B");
    assert!(taken.held);
    assert_eq!(taken.epoch, epoch + 1);
    assert_site_refused(
        &a,
        || block_on(on_a.client().renew_lease(&site_id, epoch)),
        "lease-lost",
    );

    // Fresh at database time (31 s ahead of the system's).
    let soon = |x: &mut bc_wire::site_v1::DiscoveryAssertion| {
        x.issued_at_unix_ms = now_ms() + 31_000;
        x.not_after_unix_ms = now_ms() + 600_000;
    };
    let token = on_b
        .secret(&boot_add(b, "dc1", MAC, &[]))
        .expect("B's holder gets the discovery token");
    for cp in [&a, b] {
        let machine = Machine::new(cp, MAC, UUID);
        assert_refused_as(
            cp,
            Refusal::Join("discovery"),
            || machine.boot(&cmdline(&token, &on_b.assertion(epoch, soon))),
            "lease-epoch",
        );
        machine.agent.assert_nothing_written();
    }
    // The refusals spent nothing: under the new epoch, the machine joins via A.
    let machine = Machine::new(&a, MAC, UUID);
    assert_ok(&machine.boot(&cmdline(&token, &on_b.assertion(taken.epoch, soon))));
}

/// A token id with a wrong secret: refused as `token-secret`.
fn forged(token: &str) -> String {
    let id = token.split('.').next().expect("a token id");
    format!("{id}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
}

/// Runs one forged-token `bcd join` per agent, all started together: each
/// is refused.
fn refused_joins_at_once(agents: &[Agent], forged: &str) {
    let start = Barrier::new(agents.len());
    std::thread::scope(|s| {
        let joins: Vec<_> = agents
            .iter()
            .map(|agent| {
                let cmd = agent.token_join(forged, &[]);
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    output_within(cmd, DEADLINE)
                })
            })
            .collect();
        for (join, agent) in joins.into_iter().zip(agents) {
            assert_access_denied(&join.join().expect("a join thread"));
            agent.assert_nothing_written();
        }
    });
}

/// How many `token-secret` join refusals the events count (aggregated
/// repeats as their `data.count`), as `cp`'s CLI lists them.
fn token_secret_refusals(cp: &ControlPlane) -> u64 {
    cp.refusal_counts()
        .get(&(JOIN_REFUSED.to_owned(), "token-secret".to_owned()))
        .copied()
        .unwrap_or(0)
}

const PER_REPLICA: usize = 4;

/// Identical refusals (same reason, token and source) made at once on
/// three replicas: each replica's writer aggregates its own into a first
/// event and a counted repeat, so the events add up to exactly the
/// refusals answered, whichever replica's CLI lists them; none is lost and
/// none counted twice.
#[test]
fn refusals_spread_over_three_replicas_are_counted_exactly_once() {
    let (a, others) = replicated(2);
    let replicas = [&a, &others[0], &others[1]];
    let forged = forged(&a.token("node", &[]));
    let token_id = forged.split('.').next().expect("a token id");
    let agents: Vec<Agent> = replicas
        .iter()
        .flat_map(|cp| (0..PER_REPLICA).map(|_| Agent::new(cp)))
        .collect();
    refused_joins_at_once(&agents, &forged);

    let n = (replicas.len() * PER_REPLICA) as u64;
    // An answered refusal is committed (or waited for, at most 2 s): wait
    // for all of them, then check that there is not one more.
    wait_for(|| (token_secret_refusals(&a) >= n).then_some(()));
    for cp in replicas {
        assert_eq!(
            cp.refusal_counts(),
            std::collections::BTreeMap::from([(
                (JOIN_REFUSED.to_owned(), "token-secret".to_owned()),
                n
            )]),
            "exactly {n} refusals, as every replica lists them"
        );
    }
    let events = a.refusals();
    for e in &events {
        assert_eq!(e["tokenId"], token_id, "{e}");
        assert_eq!(e["attestor"], "join-token", "{e}");
        assert_eq!(e["data"]["source"], "127.0.0.1", "{e}");
    }
    // Per replica and minute: the first refusal's event and one counted
    // repeat (a minute boundary may split a replica's in two).
    assert!(events.len() >= replicas.len(), "{events:?}");
    assert!(events.len() <= replicas.len() * 4, "{events:?}");
    // Each replica refused its own and logged its first at warn.
    for cp in replicas {
        let log = cp.log();
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("join refused")
                && l.contains("token-secret")),
            "{log}"
        );
    }
}

/// `[events] retention = "1d"`: what every control plane of these tests
/// keeps.
const RETENTION_1D: &str = "[events]\nretention = \"1d\"\n";

/// Rows per kind of the test's own events: more than two pruning batches
/// (5,000 rows each), so that two pruners share the work.
const BULK: u64 = 12_000;

/// The database's time (`Tx::now`): the server's clock plus `clock set`'s
/// offset, in ms.
const DB_NOW: &str = "(CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT) \
     + COALESCE((SELECT CAST(value AS BIGINT) FROM settings WHERE key = 'clock_offset_ms'), 0))";

/// How many events of `kind` the database holds.
fn events_of(pg: &crate::pg_cluster::PgDb, kind: &str) -> u64 {
    pg.psql(&format!(
        "SELECT count(*) FROM events WHERE type = '{kind}'"
    ))
    .parse()
    .expect("a count")
}

/// The `deleted=N` of every "pruned expired events" line of `log`.
fn pruned(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("pruned expired events"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("deleted="))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no deleted=N in {l:?}"))
        })
        .collect()
}

/// A database clock this far ahead of every event older than the
/// retention (1d): `at < {DB_NOW} - 1d`.
fn expired(pg: &crate::pg_cluster::PgDb) -> u64 {
    pg.psql(&format!(
        "SELECT count(*) FROM events WHERE at < {DB_NOW} - 86400000"
    ))
    .parse()
    .expect("a count")
}

/// The join refusals of the token `id` the database holds (rows).
fn refusal_rows_of(pg: &crate::pg_cluster::PgDb, id: &str) -> u64 {
    pg.psql(&format!(
        "SELECT count(*) FROM events WHERE type = '{JOIN_REFUSED}' AND token_id = '{id}'"
    ))
    .parse()
    .expect("a count")
}

/// Two replicas whose event writers prune at once (each prunes when it
/// starts; the test's session holds `events` locked until both are at
/// their first batch), once the retention expired a bulk of events: in
/// batches, between them, they delete exactly the expired events, once
/// each (the deletions they log add up), and keep every other one, the
/// refusals written since included; neither logs a warning or an error.
#[test]
fn two_replicas_pruning_at_once_delete_exactly_the_expired_events() {
    let a = ControlPlane::start_with_config_on(Backend::Postgres, RETENTION_1D);
    let pg = a.pg.clone().expect("on PostgreSQL");
    let (first_id, forged) = forged_for(&a);
    // Expiring: a real refusal, and the bulk an hour old.
    refused_joins_at_once(&[Agent::new(&a)], &forged);
    wait_for(|| (token_secret_refusals(&a) == 1).then_some(()));
    pg.psql(&format!(
        "INSERT INTO events (type, at, data) \
         SELECT 'test.expiring', {DB_NOW} - 3600000 - g, '{{}}' FROM generate_series(1, {BULK}) g"
    ));
    let out = a.cli(&["events", "prune"]);
    assert_ok(&out);
    assert!(
        stdout(&out).starts_with("deleted 0 events"),
        "nothing is a day old yet: {}",
        stdout(&out)
    );

    // Two days later: all of that has expired; what is written now (this
    // day's bulk, a refusal) has not.
    assert_ok(&a.cli(&["clock", "set", "--offset", "2d"]));
    pg.psql(&format!(
        "INSERT INTO events (type, at, data) \
         SELECT 'test.kept', {DB_NOW} - g, '{{}}' FROM generate_series(1, {BULK}) g"
    ));
    refused_joins_at_once(&[Agent::new(&a)], &forged);
    wait_for(|| (token_secret_refusals(&a) == 2).then_some(()));
    let to_delete = expired(&pg);
    assert!(to_delete > BULK, "the bulk and the day-old refusal");
    let total: u64 = pg
        .psql("SELECT count(*) FROM events")
        .parse()
        .expect("a count");

    // Both replicas' first prune waits on the test's lock (or, while one
    // writer at a time holds the store's write lock, on that): released
    // once two backends of this database wait, one of them on `events`.
    let mut lock = PsqlSession::start(&pg);
    lock.run("BEGIN; LOCK TABLE events IN EXCLUSIVE MODE;", "locked");
    let replicas = std::thread::scope(|s| {
        let release = s.spawn(|| {
            wait_for(|| {
                let waiting = pg.psql(
                    "SELECT count(*), count(*) FILTER (WHERE relation = 'events'::regclass) \
                     FROM pg_locks WHERE NOT granted AND database = \
                     (SELECT oid FROM pg_database WHERE datname = current_database())",
                );
                let counts: Vec<u64> = waiting
                    .split('|')
                    .map(|n| n.parse().expect("a count"))
                    .collect();
                (counts[0] >= 2 && counts[1] >= 1).then_some(())
            });
            lock.run("COMMIT;", "released");
        });
        let replicas = a.replicas(2);
        release.join().expect("the lock's release");
        replicas
    });
    let (b, c) = (&replicas[0], &replicas[1]);
    // A writer writes a refusal only after its first prune: once each
    // replica's own refusal (its own token) is listed, both have pruned.
    let mine = [forged_for(&a), forged_for(&a)];
    refused_joins_at_once(&[Agent::new(b)], &mine[0].1);
    refused_joins_at_once(&[Agent::new(c)], &mine[1].1);
    for (id, _) in &mine {
        wait_for(|| (refusal_rows_of(&pg, id) == 1).then_some(()));
    }

    let (log_b, log_c) = (b.log(), c.log());
    let (by_b, by_c) = (pruned(&log_b), pruned(&log_c));
    eprintln!("pruned at start: b {by_b:?}, c {by_c:?}");
    assert_eq!(
        by_b.iter().chain(&by_c).sum::<u64>(),
        to_delete,
        "between them, the replicas deleted each expired event once:\n{log_b}\n{log_c}"
    );
    assert_eq!(expired(&pg), 0);
    assert_eq!(events_of(&pg, "test.expiring"), 0);
    assert_eq!(events_of(&pg, "test.kept"), BULK);
    // Nothing else went: the two refusals since are there, and the count
    // is what it was less the expired.
    let now: u64 = pg
        .psql("SELECT count(*) FROM events")
        .parse()
        .expect("a count");
    assert_eq!(now, total - to_delete + 2);
    assert_eq!(
        refusal_rows_of(&pg, &first_id),
        1,
        "the refusal of this day stays, the day-old one went"
    );
    for (name, log) in [("b", &log_b), ("c", &log_c)] {
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .filter(|l| !l.contains("join refused"))
            .collect();
        assert!(bad.is_empty(), "replica {name} warned: {bad:#?}");
    }
}

/// A new token's id and a forged token of it.
fn forged_for(cp: &ControlPlane) -> (String, String) {
    let forged = forged(&cp.token("node", &[]));
    let id = forged.split('.').next().expect("a token id").to_owned();
    (id, forged)
}
