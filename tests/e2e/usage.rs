//! Bad input on the agent's side: clear errors, nonzero exits, nothing written.

use crate::harness::*;

#[test]
fn a_malformed_config_names_the_file_line_and_key() {
    let cp = ControlPlane::init_only();
    let good = cp.agent_config(std::path::Path::new("/nonexistent/data"));
    let bad = good.replacen("trust_domain", "trust_domian", 1);
    let agent = Agent::with_config(&bad);
    let out = agent.run(&["join", "--token-file", "/dev/null"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let line = bad
        .lines()
        .position(|l| l.starts_with("trust_domian"))
        .unwrap()
        + 1;
    assert!(
        err.contains(&agent.config.to_string_lossy().into_owned()),
        "names the file: {err}"
    );
    assert!(
        err.contains(&format!(":{line}")),
        "names line {line}: {err}"
    );
    assert!(err.contains("trust_domian"), "names the key: {err}");
    agent.assert_nothing_written();

    let not_https = good.replacen("https://", "http://", 1);
    let out = Agent::with_config(&not_https).run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("https"), "{}", stderr(&out));

    let bad_key = good.replacen(
        "-----BEGIN PUBLIC KEY-----\n",
        "-----BEGIN PUBLIC KEY-----\nAAAA",
        1,
    );
    let out = Agent::with_config(&bad_key).run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("join_signing_key"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_config_says_which_file() {
    let agent = Agent::with_config("");
    std::fs::remove_file(&agent.config).unwrap();
    let out = agent.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&*agent.config.to_string_lossy()),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_unreachable_control_plane_is_a_clear_error() {
    let mut cp = ControlPlane::start();
    let token = cp.token("node", &[]);
    let agent = Agent::new(&cp);
    cp.stop();
    let out = agent.join_with_token(&token);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("cannot reach the control plane"), "{err}");
    assert!(err.contains(&cp.url), "names the URL: {err}");
    agent.assert_nothing_written();
}

#[test]
fn no_token_is_a_clear_error() {
    let cp = ControlPlane::init_only();
    let agent = Agent::new(&cp);
    let out = agent.run(&["join"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("BCD_JOIN_TOKEN"),
        "says where a token comes from: {}",
        stderr(&out)
    );
    agent.assert_nothing_written();
}

#[test]
fn a_token_is_never_taken_from_argv() {
    let cp = ControlPlane::init_only();
    let agent = Agent::new(&cp);
    let out = agent.run(&[
        "join",
        "--token",
        "tok_x.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ]);
    assert_eq!(out.status.code(), Some(2));
    agent.assert_nothing_written();
}

#[test]
fn status_of_a_machine_that_never_joined() {
    let cp = ControlPlane::init_only();
    let agent = Agent::new(&cp);
    let out = agent.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("not joined"), "{}", stdout(&out));
    let out = agent.run(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["joined"], false);
}

#[test]
fn control_plane_cli_refuses_bad_input() {
    let cp = ControlPlane::init_only();
    for (args, names) in [
        (&["token", "create", "--role", "admin"][..], "admin"),
        (&["token", "create", "--role", "node", "--uses", "0"], "0"),
        (
            &["token", "create", "--role", "node", "--ttl", "soon"],
            "soon",
        ),
    ] {
        let out = cp.cli(args);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(stdout(&out).is_empty(), "{args:?} prints no token");
        assert!(stderr(&out).contains(names), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(
        cp.json(&["token", "list"]),
        serde_json::json!([]),
        "no token made"
    );
    // A whole token pasted as the id is refused without echoing its secret.
    let token = cp.token("node", &[]);
    let tokens = cp.json(&["token", "list"]);
    let out = cp.cli(&["token", "revoke", &token]);
    assert_eq!(out.status.code(), Some(1));
    let secret = token.split_once('.').unwrap().1;
    assert!(!stderr(&out).contains(secret) && !stdout(&out).contains(secret));
    assert!(!stderr(&out).is_empty(), "the refusal says why");
    assert_eq!(cp.json(&["token", "list"]), tokens, "nothing revoked");
    let events = cp.events();
    assert!(
        !serde_json::to_string(&events).unwrap().contains(secret),
        "the secret reaches no event"
    );
    let out = cp.cli(&["token", "revoke", "tok_nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    // init refuses to overwrite a bundle, and changes nothing in DIR.
    let snapshot = || -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(cp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&p).unwrap())
            })
            .collect();
        files.sort();
        files
    };
    let before = snapshot();
    let out = cp.cli(&["init"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
    assert!(!stderr(&out).is_empty(), "the refusal says why");
    assert_eq!(snapshot(), before, "init changed nothing");
}

/// A 50 MB value in the config: the error quotes a bounded piece of it.
#[test]
fn a_huge_config_value_is_not_echoed() {
    let cp = ControlPlane::init_only();
    let good = cp.agent_config(std::path::Path::new("/nonexistent/data"));
    let huge = "x".repeat(50 << 20);
    // Within the size limit, one bad value; then a file over the limit.
    let long = good.replacen(
        "trust_domain = \"",
        &format!("trust_domain = \"{}", &huge[..900_000]),
        1,
    );
    let over = good.replacen("trust_domain = \"", &format!("trust_domain = \"{huge}"), 1);
    for (text, says) in [(long, "trust_domain"), (over, "at most 1048576 bytes")] {
        let agent = Agent::with_config(&text);
        let out = agent.run(&["status"]);
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(err.len() < 1024, "{} bytes on stderr", err.len());
        assert!(err.contains(says), "{err}");
    }
}
