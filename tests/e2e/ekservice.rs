//! EK certificates from the maker's online service (`[tpm.ek_services]`):
//! a TPM with no EK certificate in NV, whose certificate the test maker
//! issued and a local HTTPS server (a real TLS listener, its own test CA,
//! which the control plane is told to trust with `ca_bundle`) serves at the
//! Intel or the AMD addressing. swtpm reports the manufacturer "IBM", so
//! each test points a service's `manufacturer` at it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;

use crate::eksource::without_ek_certificates;
use crate::harness::*;
use crate::maker::{certify_ek, create_ek};

/// What the stand-in service answers at a path.
#[derive(Clone)]
enum Answer {
    Ok(Vec<u8>),
    Status(u16),
    /// 64 KiB of certificate-looking bytes (past the control plane's cap).
    Huge,
    /// The answer after 5 s (past the control plane's 2 s timeout).
    Slow(Vec<u8>),
}

/// A maker's EK certificate service: answers by path, records each
/// request's path.
struct MakerService {
    server: Option<InProcessServer>,
    /// The test CA the server's certificate chains to (PEM).
    ca_pem: String,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl MakerService {
    fn start() -> Self {
        let bc_test_support::tls::LoopbackTls {
            ca: ca_cert,
            server: tls,
        } = bc_test_support::tls::loopback_tls("bcd e2e maker service CA");
        let answers: Arc<Mutex<HashMap<String, Answer>>> = Arc::default();
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let (a, r) = (answers.clone(), requests.clone());
        let router = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let (a, r) = (a.clone(), r.clone());
            async move {
                let path = req.uri().path().to_owned();
                r.lock().unwrap().push(path.clone());
                let answer = a.lock().unwrap().get(&path).cloned();
                use axum::response::IntoResponse;
                match answer {
                    None => axum::http::StatusCode::NOT_FOUND.into_response(),
                    Some(Answer::Ok(body)) => body.into_response(),
                    Some(Answer::Status(s)) => {
                        axum::http::StatusCode::from_u16(s).unwrap().into_response()
                    }
                    Some(Answer::Huge) => {
                        let mut body = vec![0x30, 0x82, 0xff, 0xff];
                        body.resize(64 * 1024, 0x41);
                        body.into_response()
                    }
                    Some(Answer::Slow(body)) => {
                        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                        body.into_response()
                    }
                }
            }
        });
        MakerService {
            server: Some(InProcessServer::start(Arc::new(tls), router)),
            ca_pem: ca_cert.pem(),
            answers,
            requests,
        }
    }

    fn url(&self) -> String {
        self.server.as_ref().unwrap().url.clone()
    }

    fn answer(&self, path: &str, answer: Answer) {
        self.answers.lock().unwrap().insert(path.to_owned(), answer);
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// The service goes away: nothing listens at its port.
    fn stop(&mut self) {
        self.server.take();
    }
}

/// A control plane trusting the test maker whose `service` (`intel` or
/// `amd`) serves TPMs reporting swtpm's manufacturer, at `path_prefix` of
/// the stand-in, trusting its CA; the other service off.
fn control_plane(maker: &MakerService, service: &str, path_prefix: &str) -> ControlPlane {
    let other = if service == "intel" { "amd" } else { "intel" };
    let cp = ControlPlane::init_only();
    std::fs::write(cp.path().join("services-ca.pem"), &maker.ca_pem).unwrap();
    let config = format!(
        "[tpm]\nenrollment_retry_after = \"1s\"\n\
         [tpm.ek_services]\ntimeout = \"2s\"\nca_bundle = \"services-ca.pem\"\n\
         [tpm.ek_services.{service}]\nurl = \"{}{path_prefix}{{ek}}\"\nmanufacturer = \"IBM\"\n\
         [tpm.ek_services.{other}]\nurl = \"\"\n",
        maker.url()
    );
    cp.write_config(&config);
    let cp = cp.restart();
    assert_ok(&cp.cli(&["ek-roots", "add", &fixture("ek-root.pem")]));
    assert_ok(&cp.cli(&[
        "ek-roots",
        "add",
        "--intermediate",
        &fixture("ek-intermediate.pem"),
    ]));
    cp
}

/// The RSA EK bcd joins with when NV holds no certificate (the default
/// template's), its TPMT_PUBLIC.
fn rsa_ek(tpm: &Swtpm) -> Vec<u8> {
    let ctx = tpm.dir.path().join("rsa-ek.ctx");
    create_ek(tpm, &["-G", "rsa", "-c", &ctx.to_string_lossy()])
}

/// sha256 of what a maker hashes, as the test computes it on its own.
fn sha256(parts: &[&[u8]]) -> Vec<u8> {
    bc_wire::sha256(&parts.concat()).to_vec()
}

/// The Intel path of an RSA EK: base64url(sha256(n ‖ 01 00 01)), `=` as %3D.
fn intel_path(ek_public: &[u8]) -> String {
    let Some(bc_wire::tpm::KeyParams::Rsa { modulus, .. }) = bc_wire::tpm::Public::parse(ek_public)
        .ok()
        .map(|p| p.params)
    else {
        panic!("not an RSA EK")
    };
    let h = sha256(&[&modulus, &[1, 0, 1]]);
    format!(
        "/ekcertservice/{}",
        base64::engine::general_purpose::URL_SAFE
            .encode(h)
            .replace('=', "%3D")
    )
}

/// The AMD path of an RSA EK: hex(sha256(00 00 22 22 ‖ e ‖ n)[..16]).
fn amd_path(ek_public: &[u8]) -> String {
    let Some(bc_wire::tpm::KeyParams::Rsa { modulus, .. }) = bc_wire::tpm::Public::parse(ek_public)
        .ok()
        .map(|p| p.params)
    else {
        panic!("not an RSA EK")
    };
    let h = sha256(&[&[0, 0, 0x22, 0x22], &65537u32.to_be_bytes(), &modulus]);
    format!("/pki/aia/{}", hex::encode(&h[..16]))
}

/// Intel's answer: JSON with the DER in base64url.
fn intel_json(der: &[u8]) -> Vec<u8> {
    format!(
        "{{\"pubhash\":\"x\",\"certificate\":\"{}\"}}",
        base64::engine::general_purpose::URL_SAFE.encode(der)
    )
    .into_bytes()
}

fn assurance_of(cp: &ControlPlane, agent: &Agent) -> String {
    let node = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    cp.nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node.as_str())
        .unwrap()["ekAssurance"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Intel's addressing: tpm2-tools' `tpm2_getekcertificate` asks the same
/// path and reads the same JSON; the join is `maker-service`, the second
/// join of that EK asks nothing (the cache); a certificate for another EK
/// is `ek-mismatch`; a service that is down, too slow or too large is
/// `ek-service`; a `404` is no certificate at all (`ek-chain`), not asked
/// again.
#[test]
fn intel_service_certificates_join_cached_and_bounded() {
    let mut maker = MakerService::start();
    let cp = control_plane(&maker, "intel", "/ekcertservice/");
    let tpm = Swtpm::start();
    without_ek_certificates(&tpm);
    let ek = rsa_ek(&tpm);
    let der = certify_ek(&tpm, &ek);
    let path = intel_path(&ek);
    maker.answer(&path, Answer::Ok(intel_json(&der)));

    // tpm2-tools asks the same path and reads the answer as Intel's.
    let tss = tpm.dir.path().join("ek.tss");
    std::fs::write(&tss, [&(ek.len() as u16).to_be_bytes()[..], &ek].concat()).unwrap();
    let pem = tpm.dir.path().join("getek.pem");
    let out = tpm.tool(
        "tpm2_getekcertificate",
        &[
            "-X",
            "-u",
            &tss.to_string_lossy(),
            "-o",
            &pem.to_string_lossy(),
            &format!("{}/ekcertservice/", maker.url()),
        ],
    );
    assert_ok(&out);
    assert_eq!(maker.requests(), std::slice::from_ref(&path));
    let got = std::fs::read_to_string(&pem).unwrap();
    let b64: String = got.lines().filter(|l| !l.starts_with("-----")).collect();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap(),
        der
    );

    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(maker.requests(), [path.clone(), path.clone()]);
    assert_eq!(assurance_of(&cp, &agent), "maker-service");
    // The same EK again: from the cache, the service sees nothing.
    assert_ok(&agent.run(&["join", "--attestor", "tpm", "--reset", "--yes"]));
    assert_eq!(maker.requests().len(), 2);
    assert_eq!(assurance_of(&cp, &agent), "maker-service");

    // Another machine, whose address the service answers with the first
    // machine's certificate: ek-mismatch, and not cached.
    let other = Swtpm::start_another_machine();
    without_ek_certificates(&other);
    let other_ek = rsa_ek(&other);
    let other_path = intel_path(&other_ek);
    maker.answer(&other_path, Answer::Ok(intel_json(&der)));
    let b = Agent::with_tpm(&cp, &other);
    b.allow_ek(&cp);
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-mismatch", || {
        b.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    b.assert_nothing_written();

    // Too large, too slow, an error: ek-service, each asked anew, and the
    // log says which (the slow one ended by the 2 s timeout, not its answer).
    let asked = maker.requests().len();
    for (answer, why) in [
        (Answer::Huge, "answered more than"),
        (Answer::Slow(intel_json(&der)), "no answer within 2000 ms"),
        (Answer::Status(503), "answered HTTP 503"),
    ] {
        maker.answer(&other_path, answer);
        let out = cp.refused_once(Refusal::Join("tpm"), "ek-service", || {
            b.run(&["join", "--attestor", "tpm"])
        });
        assert_access_denied(&out);
        let log = cp.log();
        assert!(
            log.lines()
                .any(|l| l.contains("gave no certificate") && l.contains(why)),
            "{why}: {log}"
        );
    }
    assert_eq!(maker.requests().len(), asked + 3);
    b.assert_nothing_written();

    // 404: the maker has no certificate for this EK, as if none existed.
    maker.answer(&other_path, Answer::Status(404));
    for _ in 0..2 {
        let out = cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
            b.run(&["join", "--attestor", "tpm"])
        });
        assert_access_denied(&out);
    }
    assert_eq!(maker.requests().len(), asked + 4, "a 404 is believed");

    // The service down: ek-service, at once; the cached machine still joins.
    maker.stop();
    let third = Swtpm::start_sha1_only();
    without_ek_certificates(&third);
    let c = Agent::with_tpm(&cp, &third);
    c.allow_ek(&cp);
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-service", || {
        c.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    c.assert_nothing_written();
    assert_ok(&agent.run(&["join", "--attestor", "tpm", "--reset", "--yes"]));
    assert!(cp
        .log()
        .contains("the maker's EK certificate service gave no certificate"));
}

/// AMD's addressing (the first 16 bytes of its hash, in hex), the DER
/// answered as it is.
#[test]
fn an_amd_service_certificate_joins() {
    let maker = MakerService::start();
    let cp = control_plane(&maker, "amd", "/pki/aia/");
    let tpm = Swtpm::start();
    without_ek_certificates(&tpm);
    let ek = rsa_ek(&tpm);
    let der = certify_ek(&tpm, &ek);
    let path = amd_path(&ek);
    maker.answer(&path, Answer::Ok(der));
    let agent = Agent::tpm_joined(&cp, &tpm);
    assert_eq!(maker.requests(), [path]);
    assert_eq!(assurance_of(&cp, &agent), "maker-service");
}

/// Round 1 sent by hand from a machine's TPM: its CSR and hello, through
/// its bcd's client (from the same loopback address as any request here).
struct Hand {
    config: bcd::config::Config,
    rt: tokio::runtime::Runtime,
    csr: Vec<u8>,
    hello: bc_wire::agent::TpmHello,
}

impl Hand {
    fn new(agent: &Agent, tpm: &Swtpm) -> Hand {
        use bc_wire::agent::tpm_attestation::Round;
        let config = bcd::config::Config::load(&agent.config).unwrap();
        let shared = bcd::keys::TpmAccess::new(Some(&tpm.tcti())).open().unwrap();
        let key = Arc::new(bcd::keys::TpmKey::generate(shared.clone()).unwrap());
        let csr = bcd::keys::make_csr(key.as_ref()).unwrap();
        let evidence =
            bcd::evidence::tpm::TpmEvidence::new(shared, key, bc_wire::sha256(&csr)).unwrap();
        let Some(Round::Hello(hello)) = evidence.hello_message().round else {
            panic!("a hello")
        };
        Hand {
            config,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            csr,
            hello,
        }
    }

    /// A tpm join's round 1 with `hello`: whether it was challenged.
    fn challenged(&self, hello: bc_wire::agent::TpmHello) -> bool {
        use bc_wire::agent::join_response_body::Deferral;
        use bc_wire::agent::{tpm_attestation::Round, JoinRequest, JoinResponseBody};
        use prost::Message;
        let request = JoinRequest {
            csr: self.csr.clone(),
            role: bc_wire::agent::Role::Node as i32,
            attestor: "tpm".into(),
            attestation: bc_wire::agent::TpmAttestation {
                round: Some(Round::Hello(hello)),
            }
            .encode_to_vec(),
            ..Default::default()
        };
        let client = bcd::client::Client::new(&self.config).unwrap();
        match self.rt.block_on(client.join(&request)) {
            Ok(r) => matches!(
                JoinResponseBody::decode(r.body.as_slice())
                    .unwrap()
                    .deferral,
                Some(Deferral::Challenge(_))
            ),
            Err(_) => false,
        }
    }
}

/// The `i`th made-up RSA EK in the default template (L-1): a 2048-bit
/// modulus no TPM holds, as an attacker sends one.
fn made_up_rsa_ek(i: u32) -> Vec<u8> {
    let mut modulus: Vec<u8> = (0..8u8)
        .flat_map(|j| bc_wire::sha256(&[&i.to_be_bytes()[..], &[j]].concat()))
        .collect();
    modulus[0] |= 0x80;
    modulus[255] |= 1;
    let mut ek = crate::maker::rsa_l1_template();
    let at = ek.len() - 256;
    ek[at..].copy_from_slice(&modulus);
    ek
}

/// A TPM with no certificate in NV whose maker's service holds its RSA
/// EK's certificate (Intel's addressing); returns the service's path.
fn served_machine(maker: &MakerService, tpm: &Swtpm) -> String {
    without_ek_certificates(tpm);
    let ek = rsa_ek(tpm);
    let der = certify_ek(tpm, &ek);
    let path = intel_path(&ek);
    maker.answer(&path, Answer::Ok(intel_json(&der)));
    path
}

/// Issue 27, 2: 125 round-1 hellos from one address, each with a made-up
/// EK in the default template, no certificate and the maker's
/// manufacturer, ask the maker's service nothing (each is challenged: its
/// certificate would be fetched only once a TPM holding it answers); a
/// machine whose EK is on the resolve list then joins through the
/// service, the only request the service saw. Before: 120 fetches, then
/// the machine refused `ek-service` ("120 fetches in the last minute").
#[test]
fn a_flood_of_unknown_eks_asks_the_service_nothing_and_a_known_machine_joins() {
    let maker = MakerService::start();
    let cp = control_plane(&maker, "intel", "/ekcertservice/");
    let attacker = Swtpm::start_another_machine();
    let hand = Hand::new(&Agent::with_tpm(&cp, &attacker), &attacker);
    let challenged = (0..125)
        .filter(|&i| {
            let mut hello = hand.hello.clone();
            hello.ek_certificate.clear();
            hello.ek_intermediates.clear();
            hello.ek_public = made_up_rsa_ek(i);
            // As bcd sends a TPM without a certificate: its maker's id,
            // swtpm's, which this control plane's service answers for (this
            // TPM has a certificate in NV, so bcd did not ask for it).
            hello.tpm_manufacturer = u32::from_be_bytes(*b"IBM\0");
            hand.challenged(hello)
        })
        .count();
    assert_eq!(
        maker.requests(),
        Vec::<String>::new(),
        "no fetch for an EK no one knows"
    );
    assert_eq!(challenged, 125, "each made-up EK is challenged");

    let tpm = Swtpm::start();
    let path = served_machine(&maker, &tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(maker.requests(), [path]);
    assert_eq!(assurance_of(&cp, &agent), "maker-service");
}

/// An EK no operator knows, sent without a certificate: round 1 asks the
/// service nothing; once the machine answered the challenge (it holds the
/// EK) the certificate is fetched and verified, then the join request is
/// filed with its issuer; approved, the machine joins `maker-service`
/// with no second fetch. Another unknown EK the service fails for, then
/// has no certificate for, is refused `ek-service`, then `ek-chain`, and
/// files nothing.
#[test]
fn an_unknown_eks_certificate_is_fetched_once_it_answered_the_challenge() {
    let maker = MakerService::start();
    let cp = control_plane(&maker, "intel", "/ekcertservice/");
    let tpm = Swtpm::start();
    let path = served_machine(&maker, &tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();

    let hand = Hand::new(&agent, &tpm);
    assert!(hand.challenged(hand.hello.clone()));
    assert_eq!(
        maker.requests(),
        Vec::<String>::new(),
        "round 1 of an unknown EK fetches nothing"
    );
    drop(hand);

    let join = agent.command(&["join", "--attestor", "tpm"]);
    let waiting = std::thread::spawn(move || output_within(join, DEADLINE));
    let request = wait_for(|| {
        cp.json(&["requests", "list"])
            .as_array()
            .and_then(|a| a.iter().find(|r| r["ekSha256"] == ek.as_str()).cloned())
    });
    assert_eq!(request["status"], "pending");
    assert_eq!(
        maker.requests(),
        std::slice::from_ref(&path),
        "fetched in round 2"
    );
    assert!(
        request["ekIssuer"]
            .as_str()
            .unwrap()
            .contains("BCD Test EK Issuing CA 01"),
        "the request names the verified certificate's issuer: {request}"
    );
    assert_ok(&cp.cli(&["requests", "approve", request["id"].as_str().unwrap()]));
    assert_ok(&waiting.join().unwrap());
    assert_eq!(assurance_of(&cp, &agent), "maker-service");
    assert_eq!(maker.requests(), [path], "then from the cache");

    let other = Swtpm::start_another_machine();
    without_ek_certificates(&other);
    let other_path = intel_path(&rsa_ek(&other));
    let b = Agent::with_tpm(&cp, &other);
    let other_ek = b.identify()["ekSha256"].as_str().unwrap().to_owned();
    maker.answer(&other_path, Answer::Status(503));
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-service", || {
        b.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    maker.answer(&other_path, Answer::Status(404));
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        b.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    b.assert_nothing_written();
    let requests = cp.json(&["requests", "list"]);
    assert!(
        !requests
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["ekSha256"] == other_ek.as_str()),
        "{requests}"
    );
}

/// A discovery join whose token or assertion is refused asks the maker's
/// service nothing, even for the EK its boot entry expects; with both
/// good, the ramdisk's certificate is fetched and it joins
/// `maker-service`. (Discovery's helpers give the ramdisk a fake sysfs:
/// a failpoints build.)
#[cfg(feature = "failpoints")]
#[test]
fn a_refused_discovery_join_asks_the_service_nothing() {
    use crate::discovery::{assert_refused_as, boot_add, cmdline, site, Machine, SiteNode};
    use crate::discovery::{MAC, UUID};
    let maker = MakerService::start();
    let cp = control_plane(&maker, "intel", "/ekcertservice/");
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let tpm = Swtpm::start();
    let path = served_machine(&maker, &tpm);
    let m = Machine::new(&cp, MAC, UUID);
    m.agent.set_tpm(&tpm);
    let ek = m.agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    let wf = boot_add(
        &cp,
        "dc1",
        MAC,
        &["--product-uuid", UUID, "--ek-sha256", &ek],
    );

    let assertion = holder.assertion(epoch, |a| {
        a.workflow_id = wf.clone();
        a.product_uuid = UUID.to_owned();
    });
    let unknown_token = "tok_abc.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || m.boot(&cmdline(unknown_token, &assertion)),
        "token-unknown",
    );
    let line = holder.boot_line(epoch, &wf, MAC, UUID);
    let token = line
        .split(' ')
        .find_map(|w| w.strip_prefix("bc.token="))
        .unwrap()
        .to_owned();
    let other_epoch = holder.assertion(epoch + 1, |a| {
        a.workflow_id = wf.clone();
        a.product_uuid = UUID.to_owned();
    });
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || m.boot(&cmdline(&token, &other_epoch)),
        "lease-epoch",
    );
    assert_eq!(maker.requests(), Vec::<String>::new());

    let out = m.boot(&line);
    assert_ok(&out);
    assert_eq!(maker.requests(), [path]);
    let node = m.agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let listed = cp.nodes();
    let n = listed
        .iter()
        .find(|n| n["nodeId"] == node.as_str())
        .unwrap();
    assert_eq!(n["ekAssurance"], "maker-service");
}
