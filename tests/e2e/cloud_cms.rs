//! cloud-iid with CMS SignedData (PKCS#7) documents: Azure's attested
//! document, and AWS's `rsa2048` form of its identity document.
//!
//! A stand-in Azure metadata service builds a real SignedData at test time
//! (RustCrypto `cms` types, DER, RSA-SHA256 with signed attributes) under
//! a chain made here: test root → intermediate → `metadata.azure.com`.
//! The control plane trusts the root and the intermediate through
//! `[cloud_iid.azure]`; its verification code is the real one. Every
//! refusal is seen at bcd as ACCESS_DENIED and at the server by its reason.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode, Uri};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use cms::cert::{CertificateChoices, IssuerAndSerialNumber};
use cms::content_info::{CmsVersion, ContentInfo};
use cms::der::asn1::{ObjectIdentifier, OctetString, SetOfVec};
use cms::der::{Any, Decode, Encode};
use cms::signed_data::{
    CertificateSet, EncapsulatedContentInfo, SignedData, SignerIdentifier, SignerInfo, SignerInfos,
};
use cms::spki::AlgorithmIdentifierOwned;
use cms::x509_cert::attr::Attribute;
use rsa::pkcs8::DecodePrivateKey;
use serde_json::json;

use crate::cloud_iid::{assert_refused, join, vm};
use crate::harness::*;

const ID_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const ID_CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const ID_MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

const AZURE_DMI: [&str; 3] = [
    "Microsoft Corporation",
    "Virtual Machine",
    "Microsoft Corporation",
];
const ATTESTED_PATH: &str = "/metadata/attested/document";

fn rsa_key(name: &str) -> rsa::PrivateKey {
    let pem = std::fs::read_to_string(fixture(name)).expect("key fixture");
    rsa::PrivateKey::from_pkcs8_pem(&pem).expect("PKCS#8 RSA key")
}

fn any<T: cms::der::EncodeValue + cms::der::Tagged>(v: &T) -> Any {
    Any::encode_from(v).expect("encode")
}

/// A SignedData over `content`, signed by `key` as `cert` (DER) names it,
/// with `carried` certificates; `digest` is the messageDigest signed (the
/// content's SHA-256 unless a test lies). Base64, as IMDS serves it.
fn signed_data(
    content: &[u8],
    cert: &[u8],
    key: &rsa::PrivateKey,
    carried: &[&[u8]],
    digest: [u8; 32],
) -> String {
    let attr = |oid, value: Any| Attribute {
        oid,
        values: SetOfVec::try_from(vec![value]).expect("set"),
    };
    let attrs = SetOfVec::try_from(vec![
        attr(ID_CONTENT_TYPE, any(&ID_DATA)),
        attr(
            ID_MESSAGE_DIGEST,
            any(&OctetString::new(digest.to_vec()).expect("octets")),
        ),
    ])
    .expect("attributes");
    let signature = key
        .pkcs1v15_sign::<rsa::sha2::Sha256>(&attrs.to_der().expect("attrs der"))
        .expect("sign");
    let signer = cms::x509_cert::Certificate::from_der(cert).expect("signer cert");
    let alg = |oid| AlgorithmIdentifierOwned {
        oid,
        parameters: None,
    };
    let info = SignerInfo {
        version: CmsVersion::V1,
        sid: SignerIdentifier::IssuerAndSerialNumber(IssuerAndSerialNumber {
            issuer: signer.tbs_certificate().issuer().clone(),
            serial_number: signer.tbs_certificate().serial_number().clone(),
        }),
        digest_alg: alg(ID_SHA256),
        signed_attrs: Some(attrs),
        signature_algorithm: alg(RSA_ENCRYPTION),
        signature: OctetString::new(signature).expect("signature"),
        unsigned_attrs: None,
    };
    let certs = std::iter::once(cert)
        .chain(carried.iter().copied())
        .map(|d| {
            CertificateChoices::Certificate(
                cms::x509_cert::Certificate::from_der(d).expect("carried cert"),
            )
        })
        .collect::<Vec<_>>();
    let sd = SignedData {
        version: CmsVersion::V1,
        digest_algorithms: SetOfVec::try_from(vec![alg(ID_SHA256)]).expect("digests"),
        encap_content_info: EncapsulatedContentInfo {
            econtent_type: ID_DATA,
            econtent: Some(any(&OctetString::new(content.to_vec()).expect("content"))),
        },
        certificates: Some(CertificateSet::try_from(certs).expect("certs")),
        crls: None,
        signer_infos: SignerInfos::try_from(vec![info]).expect("signer infos"),
    };
    let ci = ContentInfo {
        content_type: ID_SIGNED_DATA,
        content: any(&sd),
    };
    B64.encode(ci.to_der().expect("content info"))
}

/// The certificates of the test: a trusted root and intermediate, Azure's
/// signer under them, and the signers a test swaps in.
struct Pki {
    root_pem: String,
    intermediate_pem: String,
    /// `metadata.azure.com`, key cloud-gcp.key, issued by the intermediate.
    good: Vec<u8>,
    /// Another name, same issuer and key.
    other_name: Vec<u8>,
    /// Good name and issuer, expired yesterday.
    expired: Vec<u8>,
    /// Good name, under a root the control plane does not trust.
    untrusted: Vec<u8>,
    untrusted_intermediate: Vec<u8>,
}

impl Pki {
    fn new() -> Self {
        let ca = |cn: &str| {
            let mut p = rcgen::CertificateParams::default();
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.key_usages = vec![
                rcgen::KeyUsagePurpose::KeyCertSign,
                rcgen::KeyUsagePurpose::DigitalSignature,
            ];
            p
        };
        let key = || rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let (root_key, int_key, rogue_key) = (key(), key(), key());
        let root_params = ca("Test Azure Root");
        let root = root_params.self_signed(&root_key).expect("root");
        let root_issuer = rcgen::Issuer::from_params(&root_params, &root_key);
        let int_params = ca("Test Azure Issuing CA");
        let intermediate = int_params
            .signed_by(&int_key, &root_issuer)
            .expect("intermediate");
        let issuer = rcgen::Issuer::from_params(&int_params, &int_key);
        let rogue_params = ca("Test Azure Issuing CA");
        let rogue = rogue_params.self_signed(&rogue_key).expect("rogue");
        let rogue_issuer = rcgen::Issuer::from_params(&rogue_params, &rogue_key);

        let signer_key = rcgen::KeyPair::from_pem(
            &std::fs::read_to_string(fixture("cloud-gcp.key")).expect("key fixture"),
        )
        .expect("RSA signer key");
        let leaf = |name: &str, expired: bool, by: &rcgen::Issuer<'_, &rcgen::KeyPair>| {
            let mut p = rcgen::CertificateParams::new(vec![name.to_owned()]).expect("params");
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            if expired {
                let now = time::OffsetDateTime::now_utc();
                p.not_before = now - time::Duration::days(30);
                p.not_after = now - time::Duration::days(1);
            }
            p.signed_by(&signer_key, by).expect("leaf").der().to_vec()
        };
        Pki {
            root_pem: root.pem(),
            intermediate_pem: intermediate.pem(),
            good: leaf("metadata.azure.com", false, &issuer),
            other_name: leaf("metadata.evil.example", false, &issuer),
            expired: leaf("metadata.azure.com", true, &issuer),
            untrusted: leaf("metadata.azure.com", false, &rogue_issuer),
            untrusted_intermediate: rogue.der().to_vec(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Signer {
    Good,
    /// The good certificate, but the content signed with another key.
    WrongKey,
    OtherName,
    Expired,
    Untrusted,
}

/// What the stand-in Azure IMDS serves next.
#[derive(Clone)]
struct AzMint {
    signer: Signer,
    /// createdOn, seconds from now; expiresOn is `life` later.
    created_offset: i64,
    life: i64,
    /// `None`: the nonce the agent asked for.
    nonce: Option<String>,
    /// Sign a messageDigest that is not the content's.
    wrong_digest: bool,
    /// Served as the signature as is.
    raw: Option<String>,
    /// The answer's `encoding`.
    encoding: &'static str,
    subscription: String,
    vm_id: String,
}

impl Default for AzMint {
    fn default() -> Self {
        AzMint {
            signer: Signer::Good,
            created_offset: -5,
            life: 6 * 3600,
            nonce: None,
            wrong_digest: false,
            raw: None,
            encoding: "pkcs7",
            subscription: "8d10da13-8125-4ba9-a717-bf7490507b3d".into(),
            vm_id: "02aab8a4-74ef-476e-8182-f6d2ba4166a6".into(),
        }
    }
}

fn azure_time(unix: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix).expect("time");
    t.format(time::macros::format_description!(
        "[month]/[day]/[year repr:last_two] [hour]:[minute]:[second] -0000"
    ))
    .expect("format")
}

fn attested(m: &AzMint, pki: &Pki, nonce: &str) -> String {
    if let Some(raw) = &m.raw {
        return raw.clone();
    }
    let created = time::OffsetDateTime::now_utc().unix_timestamp() + m.created_offset;
    let content = json!({
        "licenseType": "",
        "nonce": m.nonce.clone().unwrap_or_else(|| nonce.to_owned()),
        "plan": { "name": "", "product": "", "publisher": "" },
        "sku": "22_04-lts-gen2",
        "subscriptionId": m.subscription,
        "timeStamp": {
            "createdOn": azure_time(created),
            "expiresOn": azure_time(created + m.life),
        },
        "vmId": m.vm_id,
    })
    .to_string();
    let (cert, carried): (&[u8], Vec<&[u8]>) = match m.signer {
        Signer::Good | Signer::WrongKey => (&pki.good, vec![]),
        Signer::OtherName => (&pki.other_name, vec![]),
        Signer::Expired => (&pki.expired, vec![]),
        Signer::Untrusted => (&pki.untrusted, vec![&pki.untrusted_intermediate]),
    };
    let key = rsa_key(if m.signer == Signer::WrongKey {
        "cloud-other.key"
    } else {
        "cloud-gcp.key"
    });
    let digest = if m.wrong_digest {
        bc_wire::sha256(b"another document")
    } else {
        bc_wire::sha256(content.as_bytes())
    };
    signed_data(content.as_bytes(), cert, &key, &carried, digest)
}

/// Azure's IMDS: the attested document, for `Metadata: true` requests of
/// API version 2020-09-01, with the nonce asked for.
fn azure_metadata_server(mint: Arc<Mutex<AzMint>>, pki: Arc<Pki>) -> PlainServer {
    let handler = move |headers: HeaderMap, uri: Uri| {
        let (mint, pki) = (mint.clone(), pki.clone());
        async move {
            let query = uri.query().unwrap_or_default().to_owned();
            let param = |name: &str| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                    .map(str::to_owned)
            };
            if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true")
                || param("api-version").as_deref() != Some("2020-09-01")
            {
                return (StatusCode::BAD_REQUEST, String::new());
            }
            let nonce = param("nonce").unwrap_or_default();
            let m = mint.lock().expect("mint").clone();
            let body = json!({ "encoding": m.encoding, "signature": attested(&m, &pki, &nonce) });
            (StatusCode::OK, body.to_string())
        }
    };
    PlainServer::start(axum::Router::new().route(ATTESTED_PATH, axum::routing::get(handler)))
}

/// A control plane trusting the test Azure root and intermediate.
fn azure_control_plane(pki: &Pki, dir: &std::path::Path) -> ControlPlane {
    let roots = dir.join("azure-roots.pem");
    let ints = dir.join("azure-intermediates.pem");
    std::fs::write(&roots, &pki.root_pem).expect("roots");
    std::fs::write(&ints, &pki.intermediate_pem).expect("intermediates");
    ControlPlane::start_with_config_for_url(|url| {
        format!(
            "[cloud_iid]\naudience = \"{url}\"\n[cloud_iid.azure]\nroots = \"{}\"\nintermediates = \"{}\"\n",
            roots.display(),
            ints.display()
        )
    })
}

#[test]
fn an_azure_vm_joins_once_with_its_attested_document_and_every_bad_one_is_refused() {
    let pki = Arc::new(Pki::new());
    let mint = Arc::new(Mutex::new(AzMint::default()));
    let md = azure_metadata_server(mint.clone(), pki.clone());
    let files = tempfile::tempdir().expect("tempdir");
    let cp = azure_control_plane(&pki, files.path());
    let vm1 = vm(&cp, &md.url, AZURE_DMI);
    let set = |f: &dyn Fn(&mut AzMint)| {
        let mut m = mint.lock().expect("mint");
        *m = AzMint::default();
        f(&mut m);
    };
    let subscription = AzMint::default().subscription;

    assert_refused(&cp, &vm1, "unknown-instance");
    // The document names no location: a zone row could never match.
    let zoned = cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "azure",
        "--account",
        &subscription,
        "--zone",
        "westeurope",
    ]);
    assert!(!zoned.status.success());
    assert!(
        stderr(&zoned).contains("names no location"),
        "{}",
        stderr(&zoned)
    );
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "azure",
        "--account",
        &subscription,
    ]));

    set(&|m| m.signer = Signer::WrongKey);
    assert_refused(&cp, &vm1, "cloud-signature");
    set(&|m| m.wrong_digest = true);
    assert_refused(&cp, &vm1, "cloud-signature");
    set(&|m| m.signer = Signer::Untrusted);
    assert_refused(&cp, &vm1, "cloud-chain");
    set(&|m| m.signer = Signer::Expired);
    assert_refused(&cp, &vm1, "cloud-chain");
    set(&|m| m.signer = Signer::OtherName);
    assert_refused(&cp, &vm1, "cloud-signer");
    // Asked for by something else on the VM, with its own nonce.
    set(&|m| m.nonce = Some("0123456789".into()));
    assert_refused(&cp, &vm1, "cloud-audience");
    set(&|m| m.created_offset = -11 * 60);
    assert_refused(&cp, &vm1, "cloud-stale");
    set(&|m| m.life = 1);
    assert_refused(&cp, &vm1, "cloud-stale");
    set(&|m| m.created_offset = 5 * 60);
    assert_refused(&cp, &vm1, "cloud-future");
    // Base64 of something that is not a SignedData.
    set(&|m| m.raw = Some(B64.encode(b"\x30\x03\x02\x01\x01")));
    assert_refused(&cp, &vm1, "cloud-malformed");
    assert!(cp.nodes().is_empty(), "no refusal admitted anything");
    // Not the answer bcd asked for: it says so and sends nothing.
    let refusals = cp.refusal_reasons().len();
    set(&|m| m.encoding = "json");
    let out = join(&vm1);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Azure: cannot fetch the identity document")
            && stderr(&out).contains("encoding is not pkcs7"),
        "{}",
        stderr(&out)
    );
    assert_eq!(cp.refusal_reasons().len(), refusals);

    set(&|_| {});
    let out = join(&vm1);
    assert_ok(&out);
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["pool"], "default", "{nodes:?}");

    // The same VM again, from another machine: admitted once, ever.
    let copy = vm(&cp, &md.url, AZURE_DMI);
    assert_refused(&cp, &copy, "instance-reused");
    set(&|m| m.vm_id = "5c2d64e4-9a43-4cc4-b1a1-0e0f2d1f6e8a".into());
    assert_ok(&join(&copy));
    assert_eq!(cp.nodes().len(), 2);
}

/// AWS's PKCS#7 form (`rsa2048`): bcd sends the document and its signature,
/// so this sends the JoinRequest another agent could, over HTTPS through
/// bcd's client.
#[test]
fn aws_pkcs7_documents_are_accepted_and_a_bad_signature_refused() {
    use bc_wire::agent::{JoinRequest, Role};
    use bc_wire::cloud_iid::Evidence;
    use bcd::client::{Client, ClientError};

    let cp = ControlPlane::start_with_config(&format!(
        "[cloud_iid.aws]\ncertificates = \"{}\"\n",
        fixture("cloud-aws.pem")
    ));
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "aws",
        "--account",
        "111122223333",
    ]));
    let agent = Agent::new(&cp);
    let client =
        Client::new(&bcd::config::Config::load(&agent.config).expect("config")).expect("client");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let aws_cert = {
        let pem = std::fs::read(fixture("cloud-aws.pem")).expect("cert");
        let first = rustls_pemfile::certs(&mut &pem[..]).next();
        first.expect("a certificate").expect("pem").to_vec()
    };
    let document = |instance: &str| {
        json!({
            "accountId": "111122223333",
            "availabilityZone": "eu-west-1a",
            "instanceId": instance,
            "region": "eu-west-1",
        })
        .to_string()
    };
    let join_with = |pkcs7: String| {
        let csr = throwaway_csr();
        let evidence = Evidence {
            provider: "aws".into(),
            document: pkcs7,
            signature: None,
        };
        runtime.block_on(client.join(&JoinRequest {
            csr,
            role: Role::Node as i32,
            attestor: "cloud-iid".into(),
            attestation: evidence.to_json(),
            ..Default::default()
        }))
    };
    let sign = |doc: &str, key: &str| {
        let digest = bc_wire::sha256(doc.as_bytes());
        signed_data(doc.as_bytes(), &aws_cert, &rsa_key(key), &[], digest)
    };

    let denied = |r: Result<_, ClientError>| matches!(r, Err(ClientError::AccessDenied));
    let doc = document("i-0pkcs7");
    assert!(denied(join_with(sign(&doc, "cloud-other.key"))));
    assert_eq!(cp.refusal_reasons(), ["cloud-signature"]);
    assert!(join_with(sign(&doc, "cloud-aws.key")).is_ok());
    assert_eq!(cp.nodes().len(), 1);
    assert!(denied(join_with(sign(&doc, "cloud-aws.key"))));
    assert_eq!(cp.refusal_reasons(), ["cloud-signature", "instance-reused"]);
}
