//! Every refusal and every cap of the command contract.

use std::collections::HashMap;

use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::EncodePublicKey;
use prost::Message;

use super::channel::{self, ProofError, ProofExpect, NONCE_LEN, PROOF_WINDOW_MS};
use super::*;
use crate::agent::Role;
use crate::command_v1::{
    agent_frame, server_frame, Arg, ChannelHello, Command, CommandResult, SignedCommand, Status,
};

const NOW: i64 = 1_790_000_000_000;

fn cp_key() -> SigningKey {
    SigningKey::from_slice(&[0x42; 32]).unwrap()
}

fn node_key() -> SigningKey {
    SigningKey::from_slice(&[0x17; 32]).unwrap()
}

fn spki(k: &SigningKey) -> Vec<u8> {
    k.verifying_key().to_public_key_der().unwrap().into_vec()
}

fn signer(k: &SigningKey) -> impl FnOnce(&[u8]) -> Result<[u8; 64], ()> + '_ {
    move |m| {
        let s: Signature = k.sign(m);
        Ok(s.to_bytes().into())
    }
}

fn ramdisk() -> Scope {
    Scope::from_statements(&[
        "urn:bc:scope:ramdisk:inventory.refresh,logs.collect,diag.*,disk.wipe,deploy.*,boot.kexec",
    ])
    .unwrap()
}

fn wipe() -> Command {
    new_command(
        "cmd_1",
        "node_a",
        "disk.wipe",
        [("devices".to_owned(), "/dev/vda".to_owned())],
        NOW + 60_000,
    )
}

fn signed(c: &Command) -> SignedCommand {
    sign(c, "kid".into(), signer(&cp_key())).unwrap()
}

fn verify_as(s: &SignedCommand, scope: &Scope, now_ms: i64) -> Result<VerifiedCommand, Refused> {
    let key = *cp_key().verifying_key();
    verify(
        s,
        &Expect {
            signing_key: &key,
            node_id: "node_a",
            scope,
            now_ms,
        },
    )
}

fn reason(r: Result<VerifiedCommand, Refused>) -> &'static str {
    r.map(|_| "ran").unwrap_or_else(|e| e.refusal.reason())
}

/// A journal in memory, as the agent's `journal.db` behaves.
#[derive(Default)]
struct Mem(HashMap<String, i64>);

impl Journal for Mem {
    type Error = std::convert::Infallible;
    fn first_sight(
        &mut self,
        id: &str,
        not_after: i64,
        _: &SignedCommand,
    ) -> Result<bool, Self::Error> {
        Ok(self.0.insert(id.to_owned(), not_after).is_none())
    }
}

#[test]
fn a_good_command_runs_once() {
    let s = signed(&wipe());
    let mut journal = Mem::default();
    let v = verify_as(&s, &ramdisk(), NOW).unwrap();
    assert_eq!((v.id(), v.kind().name), ("cmd_1", "disk.wipe"));
    let run = v.accept(&mut journal).unwrap();
    assert_eq!(run.args().devices("devices"), ["/dev/vda"]);
    assert_eq!(run.kind().deadline_ms, 30 * 60_000);
    // Delivered again (at least once): it verifies, and the journal stops it.
    let again = verify_as(&s, &ramdisk(), NOW + 1).unwrap();
    let err = again.accept(&mut journal).unwrap_err();
    assert_eq!(err, AcceptError::Replayed("cmd_1".into()));
    assert_eq!(err.reason(), "replayed");
}

#[test]
fn every_refusal_has_its_reason() {
    let scope = ramdisk();
    // Forged: another key, another purpose, a flipped byte, no signature.
    let other = sign(&wipe(), String::new(), signer(&node_key())).unwrap();
    assert_eq!(reason(verify_as(&other, &scope, NOW)), "forged");
    let mut purpose = signed(&wipe());
    purpose.signature = crate::signing::sign(
        &cp_key(),
        crate::signing::Purpose::CommandResult,
        &[&purpose.command],
    )
    .to_vec();
    assert_eq!(reason(verify_as(&purpose, &scope, NOW)), "forged");
    let mut flipped = signed(&wipe());
    let last = flipped.command.len() - 1;
    flipped.command[last] ^= 1;
    assert!(matches!(
        reason(verify_as(&flipped, &scope, NOW)),
        "forged" | "malformed"
    ));
    let mut short = signed(&wipe());
    short.signature.truncate(63);
    assert_eq!(reason(verify_as(&short, &scope, NOW)), "forged");

    // Expired, and too long-lived.
    assert_eq!(
        reason(verify_as(&signed(&wipe()), &scope, NOW + 60_001)),
        "expired"
    );
    assert_eq!(
        reason(verify_as(&signed(&wipe()), &scope, NOW + 60_000)),
        "ran"
    );
    let mut far = wipe();
    far.not_after_unix_ms = NOW + MAX_COMMAND_LIFETIME_MS + 1;
    assert_eq!(reason(verify_as(&signed(&far), &scope, NOW)), "lifetime");
    far.not_after_unix_ms = i64::MAX;
    assert_eq!(
        reason(verify_as(&signed(&far), &scope, i64::MIN)),
        "lifetime"
    );

    // Another node's.
    let mut other_node = wipe();
    other_node.node_id = "node_b".into();
    let r = verify_as(&signed(&other_node), &scope, NOW).unwrap_err();
    assert_eq!(r.refusal, CommandRefusal::OtherNode("node_b".into()));
    assert_eq!(r.claimed_id.as_deref(), Some("cmd_1"));

    // Unknown kind, a kind outside the certificate, bad arguments.
    let mut unknown = wipe();
    unknown.kind = "disk.shred".into();
    assert_eq!(
        reason(verify_as(&signed(&unknown), &scope, NOW)),
        "unknown-kind"
    );
    let node = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
    assert_eq!(
        reason(verify_as(&signed(&wipe()), &node, NOW)),
        "kind-not-allowed"
    );
    let narrowed = Scope::from_statements(&["urn:bc:scope:ramdisk:diag.*"]).unwrap();
    assert_eq!(
        reason(verify_as(&signed(&wipe()), &narrowed, NOW)),
        "kind-not-allowed"
    );
    let mut bad = wipe();
    bad.args[0].value = "/dev/../sda".into();
    assert_eq!(reason(verify_as(&signed(&bad), &scope, NOW)), "bad-args");
    bad.args = vec![];
    assert_eq!(reason(verify_as(&signed(&bad), &scope, NOW)), "bad-args");
    let mut ids = wipe();
    ids.id = "1; rm -rf /".into();
    let r = verify_as(&signed(&ids), &scope, NOW).unwrap_err();
    assert_eq!((r.refusal.reason(), r.claimed_id), ("malformed", None));
}

#[test]
fn oversized_and_non_canonical_commands_are_refused() {
    let scope = ramdisk();
    let mut big = wipe();
    big.args.push(Arg {
        name: "z".into(),
        value: "x".repeat(MAX_COMMAND),
    });
    assert!(matches!(
        sign(&big, String::new(), signer(&cp_key())),
        Err(SignError::Oversized(_))
    ));
    // Signed anyway (a forger, or a control plane without the check).
    let bytes = big.encode_to_vec();
    let sig = crate::signing::sign(&cp_key(), crate::signing::Purpose::Command, &[&bytes]);
    let huge = SignedCommand {
        command: bytes,
        signature: sig.to_vec(),
        key_id: String::new(),
    };
    let r = verify_as(&huge, &scope, NOW).unwrap_err();
    assert_eq!(
        (r.refusal.reason(), r.claimed_id.as_deref()),
        ("oversized", Some("cmd_1"))
    );
    assert!(matches!(
        parse(&huge.encode_to_vec()),
        Err(CommandRefusal::Oversized(_))
    ));

    // An unknown field appended to a signed command: prost would drop it.
    let mut extra = wipe().encode_to_vec();
    extra.extend_from_slice(&[0x78, 0x01]);
    let sig = crate::signing::sign(&cp_key(), crate::signing::Purpose::Command, &[&extra]);
    let odd = SignedCommand {
        command: extra,
        signature: sig.to_vec(),
        key_id: String::new(),
    };
    assert_eq!(reason(verify_as(&odd, &scope, NOW)), "malformed");
    assert!(parse(b"\xff\xff").is_err());
    let ok = parse(&signed(&wipe()).encode_to_vec()).unwrap();
    assert_eq!(ok.1, wipe());
}

#[test]
fn the_control_plane_refuses_to_queue_what_the_node_may_not_run() {
    let node = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
    assert_eq!(
        check(&wipe(), &node).unwrap_err().reason(),
        "kind-not-allowed"
    );
    let inv = new_command("cmd_2", "node_a", "inventory.refresh", [], NOW);
    assert_eq!(check(&inv, &node).unwrap().0.name, "inventory.refresh");
    assert_eq!(
        Scope::from_statements(&["urn:bc:scope:site"]).unwrap().role,
        Role::Site
    );
}

fn result_of(output: &[u8], status: Status) -> CommandResult {
    let mut o = Output::new();
    o.push(output);
    new_result(
        "cmd_1",
        "node_a",
        "disk.wipe",
        status,
        "wiped",
        o,
        Times {
            started_ms: NOW,
            finished_ms: NOW + 5,
        },
    )
}

#[test]
fn results_verify_under_the_node_key_only() {
    let r = result_of(b"/dev/vda: wiped\n", Status::Ok);
    let s = sign_result(&r, "kid".into(), signer(&node_key())).unwrap();
    let key = spki(&node_key());
    assert_eq!(verify_result(&s, &key, "node_a"), Ok(r.clone()));
    assert_eq!(
        verify_result(&s, &spki(&cp_key()), "node_a"),
        Err(ResultError::Forged)
    );
    assert_eq!(
        verify_result(&s, &key, "node_b"),
        Err(ResultError::OtherNode("node_a".into()))
    );
    assert_eq!(
        verify_result(&s, b"not a key", "node_a"),
        Err(ResultError::Forged)
    );
    let back = parse_result(&s.encode_to_vec()).unwrap();
    assert_eq!(back.1, r);
    assert!(matches!(
        parse_result(&vec![0; result::MAX_RESULT + 1]),
        Err(ResultError::Oversized(_))
    ));

    // A signature over the same bytes under another purpose does not verify.
    let mut other = s.clone();
    other.signature =
        crate::signing::sign(&node_key(), crate::signing::Purpose::Command, &[&s.result]).to_vec();
    assert_eq!(
        verify_result(&other, &key, "node_a"),
        Err(ResultError::Forged)
    );
}

#[test]
fn output_is_capped_and_the_cut_is_marked() {
    let big = vec![b'x'; MAX_OUTPUT + 10];
    let r = result_of(&big, Status::Ok);
    assert_eq!(r.output.len(), MAX_OUTPUT);
    assert_eq!(r.output_len, (MAX_OUTPUT + 10) as u64);
    assert_eq!(r.output_sha256, crate::sha256(&big));
    let mut streamed = Output::new();
    for chunk in big.chunks(4096) {
        streamed.push(chunk);
    }
    assert!(streamed.is_cut());
    let s = new_result(
        "cmd_1",
        "node_a",
        "k.k",
        Status::Ok,
        "",
        streamed,
        Times {
            started_ms: 0,
            finished_ms: 0,
        },
    );
    assert_eq!(
        (s.output, s.output_len, s.output_sha256),
        (r.output.clone(), r.output_len, r.output_sha256.clone())
    );
    let signed = sign_result(&r, String::new(), signer(&node_key())).unwrap();
    assert!(verify_result(&signed, &spki(&node_key()), "node_a").is_ok());

    // A result whose output and digest disagree, or cut short of the cap.
    let check = |r: &CommandResult| {
        let s = sign_result(r, String::new(), signer(&node_key())).unwrap();
        verify_result(&s, &spki(&node_key()), "node_a").map_err(|e| e.reason())
    };
    let mut lie = result_of(b"abc", Status::Ok);
    lie.output = b"abd".to_vec();
    assert_eq!(check(&lie), Err("output"));
    let mut early = result_of(b"abc", Status::Ok);
    early.output_len = 4;
    assert_eq!(check(&early), Err("output"));
    let mut below = result_of(b"abc", Status::Ok);
    below.output_len = 2;
    assert_eq!(check(&below), Err("output"));
    let mut no_status = result_of(b"", Status::Ok);
    no_status.status = 0;
    assert_eq!(check(&no_status), Err("malformed"));
    no_status.status = 99;
    assert_eq!(check(&no_status), Err("malformed"));
    let mut backwards = result_of(b"", Status::Ok);
    backwards.finished_unix_ms = NOW - 1;
    assert_eq!(check(&backwards), Err("malformed"));
    let long = new_result(
        "cmd_1",
        "node_a",
        "k.k",
        Status::Failed,
        &"é".repeat(MAX_OUTPUT),
        Output::new(),
        Times {
            started_ms: 0,
            finished_ms: 0,
        },
    );
    assert!(long.outcome.len() <= result::MAX_OUTCOME);
    assert_eq!(check(&long), Ok(long.clone()));
}

#[test]
fn refusals_are_reported_as_results() {
    let scope = ramdisk();
    let expired = verify_as(&signed(&wipe()), &scope, NOW + 60_001).unwrap_err();
    let r = expired.result("node_a", NOW).unwrap();
    assert_eq!(
        (Status::try_from(r.status), r.kind.as_str()),
        (Ok(Status::Expired), "disk.wipe")
    );
    assert!(r.outcome.starts_with("expired: "));
    let node = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
    let refused = verify_as(&signed(&wipe()), &node, NOW).unwrap_err();
    let r = refused.result("node_a", NOW).unwrap();
    assert_eq!(Status::try_from(r.status), Ok(Status::Refused));
    assert!(r.outcome.starts_with("kind-not-allowed: "));
    let s = sign_result(&r, String::new(), signer(&node_key())).unwrap();
    assert!(verify_result(&s, &spki(&node_key()), "node_a").is_ok());
    let garbage = SignedCommand::default();
    assert_eq!(
        verify_as(&garbage, &scope, NOW)
            .unwrap_err()
            .result("node_a", NOW),
        None
    );
}

#[test]
fn the_channel_proof_binds_nonce_node_and_time() {
    let hello = ChannelHello {
        nonce: vec![7; NONCE_LEN],
        server_time_unix_ms: NOW,
    };
    let t = NOW as u64;
    let proof =
        channel::sign_proof(&hello, "node_a", t, "kid".into(), signer(&node_key())).unwrap();
    let key = spki(&node_key());
    let nonce = [7u8; NONCE_LEN];
    let expect = |now_ms| ProofExpect {
        nonce: &nonce,
        node_id: "node_a",
        node_spki: &key,
        now_ms,
    };
    assert_eq!(channel::verify_proof(&proof, &expect(NOW)), Ok(()));
    assert_eq!(
        channel::verify_proof(&proof, &expect(NOW + PROOF_WINDOW_MS)),
        Ok(())
    );
    assert!(matches!(
        channel::verify_proof(&proof, &expect(NOW + PROOF_WINDOW_MS + 1)),
        Err(ProofError::Clock { .. })
    ));
    assert!(matches!(
        channel::verify_proof(&proof, &expect(NOW - PROOF_WINDOW_MS - 1)),
        Err(ProofError::Clock { .. })
    ));
    let other_nonce = [8u8; NONCE_LEN];
    let e = ProofExpect {
        nonce: &other_nonce,
        ..expect(NOW)
    };
    assert_eq!(
        channel::verify_proof(&proof, &e),
        Err(ProofError::OtherNonce)
    );
    let e = ProofExpect {
        node_id: "node_b",
        ..expect(NOW)
    };
    assert_eq!(
        channel::verify_proof(&proof, &e),
        Err(ProofError::OtherNode("node_a".into()))
    );
    let cp = spki(&cp_key());
    let e = ProofExpect {
        node_spki: &cp,
        ..expect(NOW)
    };
    assert_eq!(channel::verify_proof(&proof, &e), Err(ProofError::Forged));
    let mut later = proof.clone();
    later.client_time_unix_ms += 1;
    assert_eq!(
        channel::verify_proof(&later, &expect(NOW)),
        Err(ProofError::Forged)
    );
    let mut short = proof.clone();
    short.nonce.pop();
    assert_eq!(
        channel::verify_proof(&short, &expect(NOW)).map_err(|e| e.reason()),
        Err("malformed")
    );
    let mut extreme = proof;
    extreme.client_time_unix_ms = u64::MAX;
    assert_eq!(
        channel::verify_proof(&extreme, &expect(i64::MIN)).map_err(|e| e.reason()),
        Err("clock")
    );
}

#[test]
fn frames_are_bounded_and_never_empty() {
    use channel::{FrameError, MAX_AGENT_FRAME, MAX_SERVER_FRAME};
    let s = signed(&wipe());
    let bytes = channel::encode_server_frame(server_frame::Frame::Command(s.clone()));
    assert_eq!(
        channel::parse_server_frame(&bytes),
        Ok(server_frame::Frame::Command(s))
    );
    assert_eq!(channel::parse_server_frame(&[]), Err(FrameError::Empty));
    assert_eq!(channel::parse_agent_frame(&[]), Err(FrameError::Empty));
    assert_eq!(
        channel::parse_server_frame(&[0xff]),
        Err(FrameError::Malformed)
    );
    assert!(matches!(
        channel::parse_server_frame(&vec![0; MAX_SERVER_FRAME + 1]),
        Err(FrameError::TooLarge { .. })
    ));
    assert!(matches!(
        channel::parse_agent_frame(&vec![0; MAX_AGENT_FRAME + 1]),
        Err(FrameError::TooLarge { .. })
    ));
    // A result at its cap fits an agent frame.
    let r = result_of(&vec![b'x'; MAX_OUTPUT + 1], Status::Ok);
    let sr = sign_result(&r, "k".repeat(64), signer(&node_key())).unwrap();
    let frame = channel::encode_agent_frame(agent_frame::Frame::Result(sr.clone()));
    assert_eq!(
        channel::parse_agent_frame(&frame),
        Ok(agent_frame::Frame::Result(sr))
    );
}

/// The parse entry points (what fuzz targets would call) take every prefix
/// and every one-byte change of valid input without panicking, and a
/// changed command never verifies as a different one.
#[test]
fn parsers_take_truncated_and_mutated_input() {
    let s = signed(&wipe());
    let command = channel::encode_server_frame(server_frame::Frame::Command(s.clone()));
    let r = sign_result(
        &result_of(b"out", Status::Ok),
        "k".into(),
        signer(&node_key()),
    )
    .unwrap();
    let result = channel::encode_agent_frame(agent_frame::Frame::Result(r.clone()));
    let raw_command = s.encode_to_vec();
    let raw_result = r.encode_to_vec();
    let statement = "urn:bc:scope:ramdisk:diag.*,disk.wipe";
    let inputs = [&command, &result, &raw_command, &raw_result];
    for input in inputs {
        let mut variants: Vec<Vec<u8>> = (0..input.len()).map(|n| input[..n].to_vec()).collect();
        for i in 0..input.len() {
            for bit in [0x01u8, 0x80] {
                let mut m = input.to_vec();
                m[i] ^= bit;
                variants.push(m);
            }
        }
        for v in &variants {
            let _ = channel::parse_server_frame(v);
            let _ = channel::parse_agent_frame(v);
            let _ = parse_result(v);
            if let Ok((sc, c)) = parse(v) {
                if let Ok(ok) = verify_as(&sc, &ramdisk(), NOW) {
                    assert_eq!((ok.id(), ok.kind().name), ("cmd_1", "disk.wipe"));
                    assert_eq!(c, wipe(), "only the signed command verifies");
                }
            }
        }
    }
    for n in 0..statement.len() {
        let _ = Scope::from_statements(&[&statement[..n]]);
    }
}
