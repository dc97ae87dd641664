//! The seed inputs, built from the real fixtures and real outputs of both
//! sides (see [`super::write_seeds`]).

use std::path::Path;

use bc_wire::agent::{
    join_response_body::Deferral, tpm_attestation::Round, JoinChallenge, JoinPending, JoinRequest,
    JoinResponseBody, RenewRequest, RenewResponse, Role, TpmAttestation, TpmKeyAttestation,
};
use bc_wire::signing::{self, Purpose};
use prost::Message;

use crate::agent::{AK_STATEMENT, RENEW_NOW};
use crate::fixtures::{self, *};
use crate::join_parts;

const TPM_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../controlplane/src/attestors/tpm/testdata"
);

fn tpm_file(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(TPM_DIR).join(name)).unwrap()
}

fn put(root: &Path, target: &str, name: &str, data: &[u8]) {
    let dir = root.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
}

/// A chain (leaf, CA) for the agent-side node key, issued by a real node CA.
fn node_chain(statements: &[String]) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    bc_controlplane::pki::init(dir.path(), TRUST_DOMAIN).unwrap();
    let bundle = bc_controlplane::pki::Bundle::load(dir.path()).unwrap();
    let at = time::OffsetDateTime::from_unix_timestamp(RENEW_NOW + 3600).unwrap();
    let issued = bundle
        .node_ca
        .issue(&bc_controlplane::pki::NodeCertSpec {
            spki_der: node_spki(),
            trust_domain: TRUST_DOMAIN,
            node_id: NODE_ID,
            statements,
            not_before: at - time::Duration::days(1),
            not_after: at + time::Duration::days(1),
        })
        .unwrap();
    vec![issued.der, bundle.node_ca.cert_der().to_vec()]
}

fn tpm_rounds() -> (bc_wire::agent::TpmHello, bc_wire::agent::TpmAnswer) {
    let Some(Round::Hello(h)) = TpmAttestation::decode(TPM_HELLO).unwrap().round else {
        panic!("hello.bin")
    };
    let Some(Round::Answer(a)) = TpmAttestation::decode(TPM_ANSWER).unwrap().round else {
        panic!("answer.bin")
    };
    (h, a)
}

fn rcgen_csr() -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .der()
        .to_vec()
}

const TOKEN: &str = "tok_abc123.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

pub(super) fn write(root: &Path) {
    eventlog(root);
    let (hello, answer) = tpm_rounds();
    let chain = node_chain(&[AK_STATEMENT.to_owned()]);
    let plain_chain = node_chain(&[]);
    let node = node_key();
    let service = service_key();
    let agent_csr_sha = bc_wire::sha256(AGENT_CSR);

    // Join requests: both TPM rounds, a sealed token, x509pop evidence.
    let tpm = |attestation: &[u8]| JoinRequest {
        csr: TPM_CSR.to_vec(),
        role: Role::Node as i32,
        attestor: "tpm".into(),
        attestation: attestation.to_vec(),
        ..Default::default()
    };
    put(
        root,
        "join_request",
        "tpm-hello",
        &tpm(TPM_HELLO).encode_to_vec(),
    );
    put(
        root,
        "join_request",
        "tpm-answer",
        &tpm(TPM_ANSWER).encode_to_vec(),
    );
    let csr = rcgen_csr();
    let sealing = bc_wire::sealing::SealingKey::from_spki_der(
        &p256::SecretKey::from_slice(&[9u8; 32])
            .unwrap()
            .public_key()
            .to_public_key_der_vec(),
    )
    .unwrap();
    let token_req = JoinRequest {
        sealed_token: sealing
            .seal(&bc_wire::sha256(&csr), TOKEN.as_bytes())
            .unwrap(),
        csr: csr.clone(),
        role: Role::Site as i32,
        claims: Some(bc_wire::agent::HardwareClaims {
            macs: vec!["52:54:00:12:34:56".into()],
            product_uuid: "4c4c4544-0035-3010-8057-b4c04f4a4e31".into(),
        }),
        ..Default::default()
    };
    put(root, "join_request", "token", &token_req.encode_to_vec());
    let evidence = x509pop(&chain, node, &bc_wire::sha256(&csr));
    let pop = JoinRequest {
        csr,
        role: Role::Node as i32,
        attestor: "x509pop".into(),
        attestation: evidence,
        ..Default::default()
    };
    put(root, "join_request", "x509pop", &pop.encode_to_vec());
    // The same sealed token under provisioned, and cloud-iid documents
    // signed by the test keys the harness trusts, at its clock.
    let provisioned = JoinRequest {
        attestor: "provisioned".into(),
        role: Role::Node as i32,
        ..token_req.clone()
    };
    put(
        root,
        "join_request",
        "provisioned",
        &provisioned.encode_to_vec(),
    );
    let at_s = fixtures::captured_at() / 1000;
    for (name, evidence) in [
        ("cloud-gcp", cloud_evidence_gcp(at_s)),
        ("cloud-aws", cloud_evidence_aws()),
    ] {
        let req = JoinRequest {
            csr: rcgen_csr(),
            role: Role::Node as i32,
            attestor: "cloud-iid".into(),
            attestation: evidence.to_json(),
            ..Default::default()
        };
        put(root, "join_request", name, &req.encode_to_vec());
    }
    cloud_seeds(root);
    helper_seeds(root, &hello, &answer);

    // Join answers: signed as sent (mode 0) and bodies to sign (mode 1).
    let joined = JoinResponseBody {
        csr_sha256: agent_csr_sha.to_vec(),
        node_id: NODE_ID.into(),
        chain: plain_chain.clone(),
        deferral: None,
    };
    let pending = JoinResponseBody {
        csr_sha256: agent_csr_sha.to_vec(),
        deferral: Some(Deferral::Pending(JoinPending {
            request_id: "jr_1".into(),
            retry_after_seconds: 30,
        })),
        ..Default::default()
    };
    let challenge = JoinResponseBody {
        csr_sha256: agent_csr_sha.to_vec(),
        deferral: Some(Deferral::Challenge(JoinChallenge {
            attestor: "tpm".into(),
            payload: vec![1, 2, 3],
            not_after_unix_ms: 1_796_000_000_000,
        })),
        ..Default::default()
    };
    for (name, body) in [
        ("joined", &joined),
        ("pending", &pending),
        ("challenge", &challenge),
    ] {
        let bytes = body.encode_to_vec();
        let signed = bc_wire::agent::JoinResponse {
            signature: signing::sign(service, Purpose::JoinResponse, &[&bytes]).to_vec(),
            key_id: signing::key_id_of(service.verifying_key()),
            body: bytes.clone(),
        };
        put(
            root,
            "join_answer",
            &format!("{name}-signed"),
            &[&[0u8][..], &signed.encode_to_vec()].concat(),
        );
        put(
            root,
            "join_answer",
            &format!("{name}-body"),
            &[&[1u8][..], &bytes].concat(),
        );
    }

    // Renewals: the captured TPM's certification of its next key, and the answer.
    let node_cert = answer.node_key.clone().unwrap();
    let renew = RenewRequest {
        csr: TPM_CSR.to_vec(),
        key_attestation: Some(TpmKeyAttestation {
            ak_public: hello.ak_public.clone(),
            key_public: node_cert.public.clone(),
            certify_info: node_cert.certify_info.clone(),
            signature: node_cert.signature.clone(),
        }),
        boot: None,
    };
    put(root, "renew_request", "tpm", &renew.encode_to_vec());
    let bare = RenewRequest {
        csr: rcgen_csr(),
        key_attestation: None,
        boot: None,
    };
    put(root, "renew_request", "bare", &bare.encode_to_vec());
    put(
        root,
        "renew_answer",
        "chain",
        &RenewResponse {
            chain: chain.clone(),
            boot: None,
        }
        .encode_to_vec(),
    );

    // TPM structures, one parser per first byte (see `tpm_wire`).
    let tpm_seeds: [(&str, u8, Vec<u8>); 10] = [
        ("ak-public", 0, hello.ak_public.clone()),
        ("ek-public", 0, hello.ek_public.clone()),
        ("quote", 1, answer.quote.clone()),
        ("certify", 1, node_cert.certify_info.clone()),
        ("signature", 2, answer.quote_signature.clone()),
        (
            "verify-quote",
            3,
            join_parts(&[&answer.quote, &answer.quote_signature]),
        ),
        (
            "key-certification",
            4,
            join_parts(&[
                &node_cert.public,
                &node_cert.certify_info,
                &node_cert.signature,
            ]),
        ),
        ("statement", 5, AK_STATEMENT.as_bytes().to_vec()),
        ("p1363", 6, join_parts(&[&[0, 0, 1, 2], &[3; 32]])),
        ("key2-certification", 4, {
            let c = bc_wire::agent::TpmKeyCertification::decode(
                tpm_file("key2-certification.bin").as_slice(),
            )
            .unwrap();
            join_parts(&[&c.public, &c.certify_info, &c.signature])
        }),
    ];
    for (name, which, bytes) in tpm_seeds {
        put(root, "tpm_wire", name, &[&[which][..], &bytes].concat());
    }

    put(
        root,
        "x509pop_evidence",
        "proof",
        &x509pop(&chain, node, &agent_csr_sha),
    );
    put(root, "join_token", "token", TOKEN.as_bytes());
    put(
        root,
        "sealed_token",
        "token",
        &sealing.seal(&agent_csr_sha, TOKEN.as_bytes()).unwrap(),
    );

    let pem: Vec<String> = bcd::pki::chain_to_pem(&plain_chain);
    let identity = format!(
        "{{\n  \"version\": 1,\n  \"nodeId\": \"{NODE_ID}\",\n  \"role\": \"node\",\n  \"trustDomain\": \"{TRUST_DOMAIN}\",\n  \"nodeKey\": \"file\",\n  \"attestor\": \"join-token\",\n  \"joinedAt\": \"2026-11-30T12:00:00Z\",\n  \"chain\": {}\n}}\n",
        serde_json_string_array(&pem)
    );
    put(root, "identity_json", "identity", identity.as_bytes());

    let ca_pem = bc_controlplane::pki::pem_encode("CERTIFICATE", &plain_chain[1]);
    let signing_pem = pem_spki(&spki_der(service));
    let enc_pem = pem_spki(
        &p256::SecretKey::from_slice(&[9u8; 32])
            .unwrap()
            .public_key()
            .to_public_key_der_vec(),
    );
    let config = format!(
        "api = \"https://cp.example:8443\"\ntrust_domain = \"{TRUST_DOMAIN}\"\ndata_dir = \"/var/lib/bcd\"\n\n[pins]\nserver_ca = \"\"\"\n{ca_pem}\"\"\"\njoin_signing_key = \"\"\"\n{signing_pem}\"\"\"\njoin_encryption_key = \"\"\"\n{enc_pem}\"\"\"\n\n[tpm]\ntcti = \"swtpm:host=127.0.0.1,port=2321\"\nek_roots = \"/etc/bcd/ek-roots.pem\"\n\n[node]\nbackoff_min = \"30s\"\nbackoff_max = \"10m\"\n"
    );
    put(root, "bcd_config", "full", config.as_bytes());
    put(
        root,
        "cp_config",
        "full",
        b"[tpm]\nnode_key = \"any\"\nchallenge_ttl = \"5m\"\nenrollment_retry_after = \"30s\"\n\n[tpm.pcr_policy]\n\"0\" = \"aa00000000000000000000000000000000000000000000000000000000000000\"\n\n[x509pop]\ngrace = \"7d\"\nwindow = \"5m\"\n\n[discovery]\napproval = \"unknown-machines\"\napproval_retry_after = \"30s\"\n",
    );
    put(
        root,
        "ek_cert",
        "captured",
        &join_parts(&[&tpm_file("ek-cert.der"), &tpm_file("ek-public.bin")]),
    );
    let _ = fixtures::captured_at();
    write_site(root);
    write_command(root);
    write_deploy(root);
}

/// The seed document as a deploy workflow makes it (the token's line
/// included), an image (one zstd frame, two as `pzstd` writes, raw bytes)
/// and boot policies (`from_facts` on a real log, one with every key).
pub(super) fn write_deploy(root: &Path) {
    let doc = format!(
        r##"{{"user-data":"#cloud-config\nwrite_files:\n  - path: /etc/bcd/token\n    content: {TOKEN}\n","meta-data":"instance-id: wf_1\nlocal-hostname: node_a\n"}}"##
    );
    put(root, "deploy_seed", "workflow", doc.as_bytes());
    put(
        root,
        "deploy_seed",
        "duplicate",
        br#"{"user-data":"a","meta-data":"b","user-data":"c"}"#,
    );
    let raw: Vec<u8> = (0..20_000u32).map(|i| (i % 13 * 17) as u8).collect();
    let z =
        ruzstd::encoding::compress_to_vec(&raw[..], ruzstd::encoding::CompressionLevel::Fastest);
    put(root, "deploy_image", "frame", &[&[0u8][..], &z].concat());
    put(
        root,
        "deploy_image",
        "frames",
        &[&[255u8][..], &z, &z].concat(),
    );
    put(
        root,
        "deploy_image",
        "raw",
        &[&[1u8][..], &raw[..64]].concat(),
    );
    let log = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../eventlog/tests/data/keylime/binary_bios_measurements-secureboot"
    ))
    .unwrap();
    let limits = bc_eventlog::Limits::default();
    let facts = bc_eventlog::extract(&bc_eventlog::parse(&log, &limits).unwrap(), &limits);
    let policy = bc_controlplane::boot_policy::from_facts(&facts);
    put(root, "boot_policy", "from-facts", policy.as_bytes());
    let every = format!(
        "secure_boot = \"required\"\ncmdline = [\"console=ttyS0 *\", \"root=*\"]\ndbx_min_entries = [\"sha256:{h}\", \"other:c1c41626-504c-4092-aca9-41f936934328:{h}\"]\n\n[firmware]\nmin_version = \"edk2-stable202302\"\n\n[[boot_app]]\ndigest = \"{h}\"\nauthority = [\"CN=Microsoft Corporation UEFI CA 2011\"]\n",
        h = "ab".repeat(32)
    );
    put(root, "boot_policy", "every-key", every.as_bytes());
}

/// The site's seeds: iPXE's requests as bcd site sees them, and the kernel
/// command line it renders (a signed assertion, a token).
pub(super) fn write_site(root: &Path) {
    let ipxe = b"GET /boot.ipxe?mac=52%3A54%3A00%3A12%3A34%3A56&uuid=4C4C4544-0042-3510-8052-B4C04F4E4D32 HTTP/1.1\r\nConnection: keep-alive\r\nUser-Agent: iPXE/1.21.1+\r\nHost: 10.0.2.100\r\n\r\n";
    put(root, "site_request", "ipxe", &[&[0u8][..], ipxe].concat());
    let downloads = b"GET /ramdisk/vmlinuz HTTP/1.1\r\nHost: s\r\nConnection: keep-alive\r\n\r\nHEAD /ramdisk/initrd HTTP/1.0\r\n\r\n";
    put(
        root,
        "site_request",
        "downloads",
        &[&[0u8][..], downloads].concat(),
    );
    let post = b"POST /boot.ipxe HTTP/1.1\r\nHost: s\r\nContent-Length: 3\r\n\r\nabc";
    put(root, "site_request", "post", &[&[0u8][..], post].concat());
    put(
        root,
        "site_request",
        "query",
        b"\x01mac=52:54:00:ab:cd:ef&uuid=&ip=10.9.9.9",
    );
    let signed = bc_wire::site::sign_assertion(
        &bc_wire::site_v1::DiscoveryAssertion {
            site_id: "site_a".into(),
            node_id: NODE_ID.into(),
            lease_epoch: 1,
            mac: "52:54:00:12:34:56".into(),
            ip: "10.0.2.15".into(),
            product_uuid: "4c4c4544-0042-3510-8052-b4c04f4e4d32".into(),
            workflow_id: "wf_1".into(),
            issued_at_unix_ms: 1_796_057_201_000,
            not_after_unix_ms: 1_796_058_101_000,
        },
        "kid".into(),
        |_| Ok::<_, ()>([7u8; 64]),
    )
    .unwrap();
    let a = bc_wire::site::to_cmdline(&signed);
    put(
        root,
        "ramdisk_cmdline",
        "booted",
        format!("BOOT_IMAGE=vmlinuz console=ttyS0 bc.token={TOKEN} bc.assertion={a} bc.now=1796057201 quiet\n").as_bytes(),
    );
    put(
        root,
        "ramdisk_cmdline",
        "repeated",
        format!("bc.token={TOKEN} bc.token={TOKEN} bc.assertion={a}").as_bytes(),
    );
}

fn x509pop(chain: &[Vec<u8>], key: &p256::ecdsa::SigningKey, csr_sha256: &[u8; 32]) -> Vec<u8> {
    let client_time_ms = 1_796_057_201_000u64;
    let sig = signing::sign(
        key,
        Purpose::X509Pop,
        &[
            csr_sha256,
            NODE_ID.as_bytes(),
            &client_time_ms.to_be_bytes(),
        ],
    );
    bc_wire::x509pop::Evidence {
        node_id: NODE_ID.into(),
        chain: chain.to_vec(),
        client_time_ms,
        sig,
    }
    .to_json()
}

fn serde_json_string_array(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\n', "\\n")))
        .collect();
    format!("[{}]", quoted.join(", "))
}

fn pem_spki(der: &[u8]) -> String {
    bc_controlplane::pki::pem_encode("PUBLIC KEY", der)
}

trait SpkiDer {
    fn to_public_key_der_vec(&self) -> Vec<u8>;
}

impl SpkiDer for p256::PublicKey {
    fn to_public_key_der_vec(&self) -> Vec<u8> {
        use p256::pkcs8::EncodePublicKey;
        self.to_public_key_der().unwrap().as_bytes().to_vec()
    }
}

fn cloud_key(name: &str) -> rsa::PrivateKey {
    use rsa::pkcs8::DecodePrivateKey;
    let pem = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tpmsim-fixtures")
            .join(name),
    )
    .unwrap();
    rsa::PrivateKey::from_pkcs8_pem(&pem).unwrap()
}

/// GCP's claims for the fuzz project, issued at `iat` (s).
fn gcp_claims(iat: i64) -> String {
    format!(
        r#"{{"iss":"https://accounts.google.com","aud":"{}","iat":{iat},"exp":{},"google":{{"compute_engine":{{"project_id":"{}","zone":"europe-west1-b","instance_id":"1234567890"}}}}}}"#,
        crate::fixtures::AUDIENCE,
        iat + 3600,
        crate::controlplane::CLOUD_ACCOUNT
    )
}

fn gcp_jwt(iat: i64) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signed = format!(
        "{}.{}",
        b64.encode(r#"{"alg":"RS256","kid":"test-gcp-1","typ":"JWT"}"#),
        b64.encode(gcp_claims(iat))
    );
    let sig = cloud_key("cloud-gcp.key")
        .pkcs1v15_sign::<rsa::sha2::Sha256>(signed.as_bytes())
        .unwrap();
    format!("{signed}.{}", b64.encode(sig))
}

fn aws_doc() -> String {
    format!(
        r#"{{"accountId":"{}","availabilityZone":"eu-west-1a","instanceId":"i-0123456789abcdef0","region":"eu-west-1"}}"#,
        crate::controlplane::CLOUD_ACCOUNT
    )
}

fn aws_signature(doc: &str) -> String {
    use base64::Engine;
    let sig = cloud_key("cloud-aws.key")
        .pkcs1v15_sign::<rsa::sha2::Sha256>(doc.as_bytes())
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(sig)
}

fn cloud_evidence_gcp(iat: i64) -> bc_wire::cloud_iid::Evidence {
    bc_wire::cloud_iid::Evidence {
        provider: "gcp".into(),
        document: gcp_jwt(iat),
        signature: None,
    }
}

fn cloud_evidence_aws() -> bc_wire::cloud_iid::Evidence {
    let doc = aws_doc();
    bc_wire::cloud_iid::Evidence {
        provider: "aws".into(),
        signature: Some(aws_signature(&doc)),
        document: doc,
    }
}

/// gcp_token, aws_document, azure_document: each mode's input.
fn cloud_seeds(root: &Path) {
    let iat = crate::cloud::NOW_MS / 1000 - 60;
    put(
        root,
        "gcp_token",
        "jwt",
        &[&[0u8][..], gcp_jwt(iat).as_bytes()].concat(),
    );
    put(
        root,
        "gcp_token",
        "claims",
        &[&[1u8][..], gcp_claims(iat).as_bytes()].concat(),
    );
    let doc = aws_doc();
    let sig = aws_signature(&doc);
    let mut signed = vec![0u8];
    signed.extend(join_parts(&[doc.as_bytes(), sig.as_bytes()]));
    put(root, "aws_document", "signed", &signed);
    put(
        root,
        "aws_document",
        "document",
        &[&[2u8][..], doc.as_bytes()].concat(),
    );
    let pkcs7 = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane/testdata/cms/signed-attrs.p7"),
    )
    .unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs7);
    put(
        root,
        "aws_document",
        "pkcs7",
        &[&[1u8][..], b64.as_bytes()].concat(),
    );
    put(
        root,
        "azure_document",
        "time-stamp",
        b"\x0011/30/20 21:19:19 -0000",
    );
    put(
        root,
        "azure_document",
        "time-stamp-offset",
        b"\x0012/31/25 23:59:59 +0530",
    );
    let content = format!(
        r#"{{"nonce":"{}","plan":{{"name":"","product":"","publisher":""}},"timeStamp":{{"createdOn":"12/31/25 23:55:00 -0000","expiresOn":"01/01/26 05:55:00 -0000"}},"vmId":"02aab8a4-74ef-476e-8182-f6d2ba4166a6","subscriptionId":"{}","sku":"22_04-lts"}}"#,
        bc_wire::cloud_iid::azure_nonce(crate::fixtures::AUDIENCE),
        crate::controlplane::CLOUD_ACCOUNT
    );
    put(
        root,
        "azure_document",
        "content",
        &[&[1u8][..], content.as_bytes()].concat(),
    );
}

/// helper_frames: requests as a caller sends them, and the captured TPM's
/// AK and node key as the helper answers them.
fn helper_seeds(root: &Path, hello: &bc_wire::agent::TpmHello, answer: &bc_wire::agent::TpmAnswer) {
    use bc_helper::proto::{self, response, Response};
    use bc_helper::{Hash, Operation};
    let mut stream = vec![0u8];
    for op in [
        Operation::Ak,
        Operation::NodeKey { unique: [7; 32] },
        Operation::Sign {
            unique: [7; 32],
            hash: Hash::Sha256,
            digest: vec![1; 32],
        },
        Operation::Certify {
            unique: [7; 32],
            qualifying: vec![2; 32],
        },
    ] {
        stream.extend(proto::frame(&op.to_request()));
    }
    put(root, "helper_frames", "requests", &stream);
    let ak_public = hello.ak_public.clone();
    let name = bc_wire::tpm::Public::parse(&ak_public).unwrap().name();
    let ak = Response {
        result: Some(response::Result::Ak(proto::AkResponse {
            public: ak_public,
            name,
            tpm: "swtpm".into(),
        })),
    };
    put(
        root,
        "helper_frames",
        "ak",
        &[&[1u8][..], &proto::frame(&ak)].concat(),
    );
    let key = Response {
        result: Some(response::Result::NodeKey(proto::NodeKeyResponse {
            public: answer.node_key.clone().unwrap().public,
        })),
    };
    put(
        root,
        "helper_frames",
        "node-key",
        &[&[2u8][..], &proto::frame(&key)].concat(),
    );
    let refused = Response {
        result: Some(response::Result::Error(proto::ErrorResponse {
            message: bc_helper::TOO_MANY.into(),
        })),
    };
    put(
        root,
        "helper_frames",
        "too-many",
        &[&[1u8][..], &proto::frame(&refused)].concat(),
    );
}

/// channel_server_frame and channel_agent_frame: a command and an ack as
/// the control plane sends them, a proof and a result as the agent does,
/// each signed by the fixture keys the bodies check with.
pub(super) fn write_command(root: &Path) {
    use bc_wire::command::channel::{encode_agent_frame, encode_server_frame, sign_proof};
    use bc_wire::command::{new_command, new_result, sign, sign_result, Output, Times};
    use bc_wire::command_v1::{agent_frame, server_frame, ChannelHello, ResultAck, Status};
    use p256::ecdsa::signature::Signer as _;

    use crate::command::{NONCE, NOW_MS};

    let by = |key: &'static p256::ecdsa::SigningKey| {
        move |input: &[u8]| {
            let sig: p256::ecdsa::Signature = key.sign(input);
            Ok::<[u8; 64], std::convert::Infallible>(sig.to_bytes().into())
        }
    };
    let commands = [
        (
            "ping",
            "diag.ping",
            vec![("echo".to_owned(), "hi".to_owned())],
        ),
        (
            "logs",
            "logs.collect",
            vec![
                ("bytes".to_owned(), "4096".to_owned()),
                ("lines".to_owned(), "100".to_owned()),
                ("since".to_owned(), "1779990000000".to_owned()),
            ],
        ),
        (
            "wipe",
            "disk.wipe",
            vec![("devices".to_owned(), "/dev/vda".to_owned())],
        ),
    ];
    for (name, kind, args) in commands {
        let cmd = new_command(
            &format!("cmd_{name}1"),
            NODE_ID,
            kind,
            args,
            NOW_MS + 60_000,
        );
        let signed = sign(&cmd, "k".into(), by(service_key())).unwrap();
        // The first byte picks the scope: 1 is a ramdisk's (disk.wipe).
        let frame = encode_server_frame(server_frame::Frame::Command(signed));
        put(
            root,
            "channel_server_frame",
            name,
            &[&[1u8][..], &frame].concat(),
        );
    }
    let ack = encode_server_frame(server_frame::Frame::Ack(ResultAck {
        id: "cmd_ping1".into(),
    }));
    put(
        root,
        "channel_server_frame",
        "ack",
        &[&[0u8][..], &ack].concat(),
    );

    let hello = ChannelHello {
        nonce: NONCE.to_vec(),
        server_time_unix_ms: NOW_MS,
    };
    let proof = sign_proof(&hello, NODE_ID, NOW_MS as u64, "k".into(), by(node_key())).unwrap();
    put(
        root,
        "channel_agent_frame",
        "proof",
        &encode_agent_frame(agent_frame::Frame::Proof(proof)),
    );
    let mut output = Output::new();
    output.push(b"pong\n");
    let result = new_result(
        "cmd_ping1",
        NODE_ID,
        "diag.ping",
        Status::Ok,
        "pong",
        output,
        Times {
            started_ms: NOW_MS,
            finished_ms: NOW_MS + 5,
        },
    );
    let signed = sign_result(&result, "k".into(), by(node_key())).unwrap();
    put(
        root,
        "channel_agent_frame",
        "result",
        &encode_agent_frame(agent_frame::Frame::Result(signed)),
    );
}

/// Real event logs (bc-eventlog's fixtures, PROVENANCE.md there): both
/// formats, one to four banks, shim's malformed authority, the missing
/// Exit Boot Services events, a short EV_NO_ACTION.
fn eventlog(root: &Path) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../eventlog/tests/data");
    for name in [
        "tpm2-tools/event.bin",
        "tpm2-tools/event-uefivar.bin",
        "tpm2-tools/event-uefiaction.bin",
        "tpm2-tools/event-uefiservices.bin",
        "tpm2-tools/specid-vendordata.bin",
        "tpm2-tools/event-sd-boot-fedora37.bin",
        "tpm2-tools/event-uefi-sha1-log.bin",
        "tpm2-tools/event-moklisttrusted.bin",
        "go-attestation/short_no_action_eventlog",
        "go-attestation/sb_cert_eventlog",
        "go-attestation/ebs_event_missing_eventlog",
    ] {
        let data = std::fs::read(dir.join(name)).unwrap();
        let file = name.rsplit('/').next().unwrap();
        put(root, "eventlog", file, &data);
    }
}
