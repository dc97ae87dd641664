//! The command channel's frames (bc-wire `command::channel`), each side's:
//! what a control plane sends an agent (commands, acks) and what an agent
//! sends a control plane (the proof, results). Random bytes never carry a
//! valid signature, so each body also signs what parsed with the fixture
//! keys and verifies that: the checks past the signature (node, times,
//! kind, arguments, output) see the fuzzer's input too.

use bc_wire::command::channel::{
    parse_agent_frame, parse_server_frame, verify_proof, ProofExpect, MAX_AGENT_FRAME,
    MAX_SERVER_FRAME, NONCE_LEN,
};
use bc_wire::command::{
    is_command_id, lookup, verify, verify_result, Expect, Scope, MAX_COMMAND, MAX_OUTPUT,
};
use bc_wire::command_v1::{agent_frame, server_frame, SignedCommand, SignedCommandResult};
use bc_wire::signing::{self, Purpose};
use prost::Message;

use crate::fixtures::{node_key, node_spki, service_key, NODE_ID};

/// The agent's clock and the server's (Unix ms): mid-2026.
pub(crate) const NOW_MS: i64 = 1_780_000_000_000;
/// The nonce the server sent, as the proof must repeat it.
pub(crate) const NONCE: [u8; NONCE_LEN] = [7; NONCE_LEN];
/// The scope statements the first byte picks from.
const SCOPES: [&str; 3] = [
    "urn:bc:scope:node",
    "urn:bc:scope:ramdisk",
    "urn:bc:scope:ramdisk:inventory.refresh,diag.*",
];

/// A frame from the control plane, as the agent parses and verifies it:
/// the first byte picks the certificate's scope, the rest is the frame.
pub fn channel_server_frame(data: &[u8]) {
    let Some((&which, frame)) = data.split_first() else {
        return;
    };
    let Ok(scope) = Scope::from_statements(&[SCOPES[usize::from(which) % SCOPES.len()]]) else {
        return;
    };
    let Ok(parsed) = parse_server_frame(frame) else {
        return;
    };
    assert!(frame.len() <= MAX_SERVER_FRAME);
    let server_frame::Frame::Command(signed) = parsed else {
        return;
    };
    let verifying = *service_key().verifying_key();
    let expect = Expect {
        signing_key: &verifying,
        node_id: NODE_ID,
        scope: &scope,
        now_ms: NOW_MS,
    };
    let _ = verify(&signed, &expect);
    let resigned = SignedCommand {
        signature: signing::sign(service_key(), Purpose::Command, &[&signed.command]).to_vec(),
        ..signed
    };
    if let Ok(v) = verify(&resigned, &expect) {
        // Verified means: ours, for this node, in time, of a known kind the
        // scope allows, within the size cap.
        assert!(is_command_id(v.id()), "{:?}", v.id());
        assert!(v.not_after_ms() >= NOW_MS);
        let kind = v.kind();
        assert!(
            lookup(kind.name).is_some_and(|k| std::ptr::eq(k, kind)),
            "{} is not the registry's",
            kind.name
        );
        assert!(scope.allows(kind), "{} past {scope:?}", kind.name);
        assert!(resigned.encoded_len() <= MAX_COMMAND);
    }
}

/// A frame from an agent, as the control plane parses and verifies it
/// (the proof against [`NONCE`], a result against the fixture node key).
pub fn channel_agent_frame(data: &[u8]) {
    let Ok(parsed) = parse_agent_frame(data) else {
        return;
    };
    assert!(data.len() <= MAX_AGENT_FRAME);
    match parsed {
        agent_frame::Frame::Proof(proof) => {
            let expect = ProofExpect {
                nonce: &NONCE,
                node_id: NODE_ID,
                node_spki: node_spki(),
                now_ms: NOW_MS,
            };
            let _ = verify_proof(&proof, &expect);
        }
        agent_frame::Frame::Result(signed) => {
            let _ = verify_result(&signed, node_spki(), NODE_ID);
            let resigned = SignedCommandResult {
                signature: signing::sign(node_key(), Purpose::CommandResult, &[&signed.result])
                    .to_vec(),
                ..signed
            };
            if let Ok(r) = verify_result(&resigned, node_spki(), NODE_ID) {
                assert!(is_command_id(&r.id), "{:?}", r.id);
                assert_eq!(r.node_id, NODE_ID);
                assert!(r.output.len() <= MAX_OUTPUT);
                assert!(r.finished_unix_ms >= r.started_unix_ms);
                // Stored as it came: its bytes are the canonical encoding.
                assert_eq!(r.encode_to_vec(), resigned.result);
            }
        }
    }
}
