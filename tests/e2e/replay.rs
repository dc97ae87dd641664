//! A captured join cannot be replayed: a real `bcd join --attestor tpm`
//! against swtpm goes through the routing proxy (TLS-terminating, with the
//! control plane's own server certificate, forwarding each Join to the real
//! control plane), and the exact round-2 bytes bcd sent are sent again.

use bc_wire::agent::JoinRequest;
use bcd::client::{Client, ClientError};
use prost::Message;

use crate::harness::*;
use crate::joinproxy::RoutingProxy;

#[test]
fn a_replayed_tpm_answer_is_refused_and_the_node_keeps_renewing() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let proxy = RoutingProxy::start(&[&cp], &agent, |_| vec![0]);
    agent.set_api(&proxy.url);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    agent.set_api(&cp.url);
    let node_id = agent.status_json()["nodeId"]
        .as_str()
        .expect("nodeId")
        .to_owned();
    let answers = proxy.answers();
    assert_eq!(answers.len(), 1, "bcd sent one round-2 answer");
    drop(proxy);

    // The exact bytes again, while the challenge is still open.
    let captured = &answers[0];
    let request = JoinRequest::decode(captured.as_slice()).unwrap();
    assert_eq!(
        &request.encode_to_vec(),
        captured,
        "the replay sends bcd's bytes"
    );
    let config = bcd::config::Config::load(&agent.config).unwrap();
    let client = Client::new(&config).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..2 {
        match rt.block_on(client.join(&request)) {
            Err(ClientError::AccessDenied) => {}
            other => panic!("expected ACCESS_DENIED, got {:?}", other.map(|_| ())),
        }
    }

    let refusals = cp.refusals();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    for r in &refusals {
        assert_eq!(
            (r["attestor"].as_str(), r["reason"].as_str()),
            (Some("tpm"), Some("challenge-reused"))
        );
    }
    let log = cp.log();
    assert!(
        log.lines()
            .any(|l| l.contains("join refused") && l.contains("challenge-reused")),
        "{log}"
    );
    let joined = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.joined")
        .count();
    assert_eq!(joined, 1);
    let row = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node_id.as_str())
        .expect("node listed");
    assert_eq!(row["identityGeneration"], 1);

    // The real node is untouched: it renews.
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));
    assert_eq!(agent.status_json()["nodeId"], node_id.as_str());
}
