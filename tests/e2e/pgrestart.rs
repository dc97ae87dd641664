//! A PostgreSQL restart under a running control plane (issue 27, item 5):
//! its pool's idle connections all end at once, and no request after fails.
//! The restart is played on the test's own database (the server is shared
//! with the tests running beside this one): every session is ended as a
//! restart ends it (SIGTERM to each backend: FATAL 57P01, then the end of
//! the stream), while the control plane keeps them idle.

use crate::harness::*;

/// Ends every session of the control plane's database (psql's own aside)
/// and waits until they are gone; how many it ended.
fn end_every_session(cp: &ControlPlane) -> usize {
    let pg = cp.pg.as_ref().expect("a control plane on PostgreSQL");
    pg.psql(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
           FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .parse()
    .expect("a count")
}

/// Runs `run` for each agent at once; every output.
fn at_once(
    agents: &[Agent],
    run: impl Fn(&Agent) -> std::process::Output + Sync,
) -> Vec<std::process::Output> {
    std::thread::scope(|s| {
        let runs: Vec<_> = agents.iter().map(|a| s.spawn(|| run(a))).collect();
        runs.into_iter()
            .map(|r| r.join().expect("an agent thread"))
            .collect()
    })
}

/// Joins and renewals (reads and writes of `serve`'s pool), one at a time
/// and at once, right after every session of the database ended: none
/// fails (today a stale connection answers HTTP 500).
#[test]
fn ended_database_sessions_fail_no_request() {
    let cp = ControlPlane::start_on(Backend::Postgres);
    let token = cp.token("node", &["--uses", "20"]);
    let renew = |a: &Agent| a.run(&["node", "--once", "--renew-now"]);
    // Joins at once, so that the pool holds several connections.
    let first: Vec<Agent> = (0..4).map(|_| Agent::new(&cp)).collect();
    for out in at_once(&first, |a| a.join_with_token(&token)) {
        assert_ok(&out);
    }

    // `serve`'s pooled connections and its clock's.
    let ended = end_every_session(&cp);
    assert!(ended >= 2, "{ended} sessions ended");
    for agent in &first {
        assert_ok(&renew(agent));
    }
    let second: Vec<Agent> = (0..4).map(|_| Agent::new(&cp)).collect();
    for agent in &second {
        assert_ok(&agent.join_with_token(&token));
    }

    // Again, with every request racing for the stale connections.
    assert!(end_every_session(&cp) >= 2);
    let third: Vec<Agent> = (0..4).map(|_| Agent::new(&cp)).collect();
    for out in at_once(&first, renew)
        .into_iter()
        .chain(at_once(&third, |a| a.join_with_token(&token)))
    {
        assert_ok(&out);
    }
    assert_eq!(cp.nodes().len(), 12);
    // Nor did anything else (an internal error is logged "request failed").
    let log = cp.log();
    assert!(!log.contains("request failed"), "{log}");
}
