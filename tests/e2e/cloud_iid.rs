//! cloud-iid: a VM joins with the identity document its cloud signs, no
//! token. A stand-in GCP metadata server (plain HTTP on loopback, as the
//! real one is on 169.254.169.254) mints RS256 identity tokens with a test
//! key the control plane trusts through `[cloud_iid.gcp] jwks`; the agent
//! finds GCP in its DMI (BCD_SYSFS_ROOT). Real bcd, real control plane,
//! real signature checks: every refusal is seen at the server by its
//! reason and at the agent as ACCESS_DENIED.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::get;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use rsa::pkcs8::DecodePrivateKey;
use serde_json::json;

use crate::harness::*;

const IDENTITY_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/identity";

/// What the stand-in metadata server mints next.
#[derive(Clone)]
struct Mint {
    /// Sign with the key the control plane trusts (else another one).
    trusted_key: bool,
    iss: String,
    /// `None`: the audience the agent asked for.
    aud: Option<String>,
    /// Seconds from now.
    iat_offset: i64,
    project: String,
    zone: String,
    instance: String,
    /// AWS: serve a document other than the one signed.
    tampered: bool,
    /// Leave out the `google.compute_engine` claims (format=standard).
    standard: bool,
    /// Served as is instead of a token.
    raw: Option<String>,
    /// The last token served, kept to replay it.
    last: Option<String>,
}

impl Default for Mint {
    fn default() -> Self {
        Mint {
            trusted_key: true,
            iss: "https://accounts.google.com".into(),
            aud: None,
            iat_offset: 0,
            project: "proj-a".into(),
            zone: "europe-west1-b".into(),
            instance: "4242424242".into(),
            tampered: false,
            standard: false,
            raw: None,
            last: None,
        }
    }
}

fn key(name: &str) -> rsa::PrivateKey {
    let pem = std::fs::read_to_string(fixture(name)).expect("key fixture");
    rsa::PrivateKey::from_pkcs8_pem(&pem).expect("PKCS#8 RSA key")
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs() as i64
}

fn jwt(m: &Mint, audience: &str) -> String {
    let header = json!({ "alg": "RS256", "kid": "test-gcp-1", "typ": "JWT" });
    let iat = now_s() + m.iat_offset;
    let mut claims = json!({
        "iss": m.iss,
        "aud": m.aud.clone().unwrap_or_else(|| audience.to_owned()),
        "azp": "1234567890",
        "sub": "1234567890",
        "iat": iat,
        "exp": iat + 3600,
        "google": { "compute_engine": {
            "project_id": m.project,
            "project_number": 1234567890,
            "zone": m.zone,
            "instance_id": m.instance,
            "instance_name": "vm-1",
            "instance_creation_timestamp": iat - 60,
        }},
    });
    if m.standard {
        claims["google"] = json!({});
    }
    let signed = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    );
    let k = key(if m.trusted_key {
        "cloud-gcp.key"
    } else {
        "cloud-other.key"
    });
    let sig = k
        .pkcs1v15_sign::<rsa::sha2::Sha256>(signed.as_bytes())
        .expect("sign");
    format!("{signed}.{}", B64.encode(sig))
}

/// The query parameter `name`, percent-decoded (the agent encodes the
/// audience URL).
fn query_param(uri: &Uri, name: &str) -> Option<String> {
    let q = uri.query()?;
    let v = q
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))?;
    let mut out = Vec::new();
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// AWS's instance identity document, as IMDS prints it, and its
/// signature (base64 RSA-SHA256, wrapped at 64 columns as IMDS does).
fn aws_document(m: &Mint) -> (String, String) {
    let doc = |instance: &str| {
        format!(
            "{{\n  \"accountId\" : \"{}\",\n  \"architecture\" : \"x86_64\",\n  \"availabilityZone\" : \"{}\",\n  \"imageId\" : \"ami-0123456789abcdef0\",\n  \"instanceId\" : \"{instance}\",\n  \"instanceType\" : \"t3.micro\",\n  \"pendingTime\" : \"2026-01-01T00:00:00Z\",\n  \"region\" : \"eu-west-1\",\n  \"version\" : \"2017-09-30\"\n}}",
            m.project, m.zone
        )
    };
    let signed = doc(&m.instance);
    let k = key(if m.trusted_key {
        "cloud-aws.key"
    } else {
        "cloud-other.key"
    });
    let sig = k
        .pkcs1v15_sign::<rsa::sha2::Sha256>(signed.as_bytes())
        .expect("sign");
    let b64 = base64::engine::general_purpose::STANDARD.encode(sig);
    let wrapped: Vec<String> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    let served = if m.tampered {
        doc("i-0someoneelse")
    } else {
        signed
    };
    (served, wrapped.join("\n"))
}

const AWS_TOKEN: &str = "AQAEAtestsessiontoken==";

/// The stand-in metadata server: GCP's identity endpoint, which wants the
/// `Metadata-Flavor: Google` header, an audience and `format=full`, and
/// AWS's IMDSv2 (a session token from PUT, then the document and its
/// signature with it).
fn metadata_server(mint: Arc<Mutex<Mint>>) -> PlainServer {
    let aws = |part: usize, mint: Arc<Mutex<Mint>>| {
        get(move |headers: HeaderMap| async move {
            if headers
                .get("x-aws-ec2-metadata-token")
                .and_then(|v| v.to_str().ok())
                != Some(AWS_TOKEN)
            {
                return (StatusCode::UNAUTHORIZED, String::new());
            }
            let (doc, sig) = aws_document(&mint.lock().expect("mint"));
            (StatusCode::OK, if part == 0 { doc } else { sig })
        })
    };
    let router = axum::Router::new()
        .route(
            "/latest/api/token",
            axum::routing::put(|headers: HeaderMap| async move {
                if headers.contains_key("x-aws-ec2-metadata-token-ttl-seconds") {
                    (StatusCode::OK, AWS_TOKEN.to_owned())
                } else {
                    (StatusCode::BAD_REQUEST, String::new())
                }
            }),
        )
        .route(
            "/latest/dynamic/instance-identity/document",
            aws(0, mint.clone()),
        )
        .route(
            "/latest/dynamic/instance-identity/signature",
            aws(1, mint.clone()),
        )
        .route(
            IDENTITY_PATH,
            get(move |headers: HeaderMap, uri: Uri| {
                let mint = mint.clone();
                async move {
                    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok())
                        != Some("Google")
                        || query_param(&uri, "format").as_deref() != Some("full")
                    {
                        return (StatusCode::FORBIDDEN, String::new());
                    }
                    let Some(audience) = query_param(&uri, "audience") else {
                        return (StatusCode::BAD_REQUEST, String::new());
                    };
                    let mut m = mint.lock().expect("mint");
                    let body = match (&m.raw, &m.last) {
                        (Some(raw), _) => raw.clone(),
                        _ => jwt(&m, &audience),
                    };
                    m.last = Some(body.clone());
                    (StatusCode::OK, body)
                }
            }),
        );
    PlainServer::start(router)
}

/// A GCP VM: DMI says Google, `[cloud] metadata_url` is the stand-in.
fn gcp_vm(cp: &ControlPlane, metadata_url: &str) -> Agent {
    vm(
        cp,
        metadata_url,
        ["Google", "Google Compute Engine", "Google"],
    )
}

/// A VM with this DMI (sys_vendor, product_name, bios_vendor).
pub(crate) fn vm(cp: &ControlPlane, metadata_url: &str, dmi_values: [&str; 3]) -> Agent {
    let agent = Agent::new(cp);
    for (f, v) in ["sys_vendor", "product_name", "bios_vendor"]
        .into_iter()
        .zip(dmi_values)
    {
        agent.sysfs(&format!("class/dmi/id/{f}"), &format!("{v}\n"));
    }
    let mut config = std::fs::read_to_string(&agent.config).expect("config");
    config.push_str(&format!("\n[cloud]\nmetadata_url = \"{metadata_url}\"\n"));
    std::fs::write(&agent.config, config).expect("write config");
    agent
}

pub(crate) fn join(agent: &Agent) -> std::process::Output {
    agent.run(&["join", "--attestor", "cloud-iid"])
}

#[track_caller]
pub(crate) fn assert_refused(cp: &ControlPlane, agent: &Agent, reason: &str) {
    let out = cp.refused_once(Refusal::Join("cloud-iid"), reason, || join(agent));
    assert_access_denied(&out);
    assert!(stderr(&out).contains("cloud-iid join"), "{}", stderr(&out));
    agent.assert_nothing_written();
}

fn gcp_control_plane() -> ControlPlane {
    gcp_control_plane_with("")
}

/// [`gcp_control_plane`] with more `[cloud_iid]` keys (e.g. `roles`).
fn gcp_control_plane_with(extra: &str) -> ControlPlane {
    ControlPlane::start_with_config_for_url(|url| {
        format!(
            "[cloud_iid]\naudience = \"{url}\"\n{extra}\n[cloud_iid.gcp]\njwks = \"{}\"\n",
            fixture("cloud-gcp-jwks.json")
        )
    })
}

/// `bcd join --attestor cloud-iid --role site`.
fn join_as_site(agent: &Agent) -> std::process::Output {
    agent
        .command(&["join", "--attestor", "cloud-iid", "--role", "site"])
        .within()
}

/// A Join as `ramdisk` with this VM's identity token, through bcd's own
/// client (bcd joins a ramdisk only with discovery, so no subcommand asks
/// for it): what a VM that crafts its request could send.
fn join_as_ramdisk(
    cp: &ControlPlane,
    agent: &Agent,
    mint: &Mint,
) -> Result<bc_wire::agent::JoinResponse, bcd::client::ClientError> {
    let config = bcd::config::Config::load(&agent.config).expect("agent config");
    let client = bcd::client::Client::new(&config).expect("client");
    let evidence = bc_wire::cloud_iid::Evidence {
        provider: "gcp".into(),
        document: jwt(mint, &cp.url),
        signature: None,
    };
    let request = bc_wire::agent::JoinRequest {
        csr: throwaway_csr(),
        role: bc_wire::agent::Role::Ramdisk as i32,
        attestor: "cloud-iid".into(),
        attestation: evidence.to_json(),
        sealed_token: Vec::new(),
        claims: None,
        tpm: None,
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(client.join(&request))
}

/// cloud-iid admits `node` only, unless `[cloud_iid] roles` or the VM's
/// resolve row (`cloud resolve add --role`) allows more: a cloud's word
/// about which VM this is makes no site node (a site node with no site)
/// and no ramdisk (without the ramdisk's scope). A refused role is
/// `cloud-role` and spends nothing: the same instance joins afterwards.
#[test]
fn a_cloud_vm_joins_only_as_a_role_it_is_allowed() {
    let mint = Arc::new(Mutex::new(Mint::default()));
    let md = metadata_server(mint.clone());
    let cp = gcp_control_plane();
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "cloud",
            "resolve",
            "add",
            "--provider",
            "gcp",
            "--account",
            "proj-a",
        ];
        args.extend_from_slice(extra);
        assert_ok(&cp.cli(&args));
    };
    resolve(&[]);
    let vm = gcp_vm(&cp, &md.url);

    let out = cp.refused_once(Refusal::Join("cloud-iid"), "cloud-role", || {
        join_as_site(&vm)
    });
    assert_access_denied(&out);
    vm.assert_nothing_written();
    let m = mint.lock().expect("mint").clone();
    assert!(matches!(
        cp.refused_once(
            Refusal::Join("cloud-iid"),
            "cloud-role",
            || join_as_ramdisk(&cp, &vm, &m)
        ),
        Err(bcd::client::ClientError::AccessDenied)
    ));
    assert!(cp.nodes().is_empty());

    // The account's resolve row allows site: this instance joins as one.
    resolve(&["--role", "site"]);
    let table = cp.json(&["cloud", "resolve", "list"]);
    assert_eq!(table[0]["roles"], json!(["site"]), "{table}");
    assert_ok(&join_as_site(&vm));
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["role"], "site", "{nodes:?}");
    // Not as ramdisk, another instance.
    let m = Mint {
        instance: "4343434343".into(),
        ..Mint::default()
    };
    assert!(matches!(
        cp.refused_once(
            Refusal::Join("cloud-iid"),
            "cloud-role",
            || join_as_ramdisk(&cp, &vm, &m)
        ),
        Err(bcd::client::ClientError::AccessDenied)
    ));

    // `[cloud_iid] roles` allows it for every account.
    let cp = gcp_control_plane_with("roles = [\"node\", \"ramdisk\"]");
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "gcp",
        "--account",
        "proj-a",
    ]));
    let vm = gcp_vm(&cp, &md.url);
    assert_access_denied(
        &cp.refused_once(Refusal::Join("cloud-iid"), "cloud-role", || {
            join_as_site(&vm)
        }),
    );
    join_as_ramdisk(&cp, &vm, &m).expect("a ramdisk join admitted");
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["role"], "ramdisk", "{nodes:?}");
    // With a ramdisk's scope, as if discovery had admitted it.
    assert_eq!(nodes[0]["maxCertTtlSeconds"], 7200, "{nodes:?}");
    assert_eq!(
        nodes[0]["allowedKinds"],
        json!(bc_controlplane::config::DISCOVERY_ALLOWED_KINDS),
        "{nodes:?}"
    );
}

#[test]
fn a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused() {
    let mint = Arc::new(Mutex::new(Mint::default()));
    let md = metadata_server(mint.clone());
    let cp = gcp_control_plane();
    let vm = gcp_vm(&cp, &md.url);
    let set = |f: &dyn Fn(&mut Mint)| {
        let mut m = mint.lock().expect("mint");
        *m = Mint::default();
        f(&mut m);
    };

    // Verified, but no resolve entry covers proj-a.
    assert_refused(&cp, &vm, "unknown-instance");
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "gcp",
        "--account",
        "proj-b",
    ]));
    assert_refused(&cp, &vm, "unknown-instance");
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "gcp",
        "--account",
        "proj-a",
    ]));

    set(&|m| m.trusted_key = false);
    assert_refused(&cp, &vm, "cloud-signature");
    set(&|m| m.aud = Some("https://another-control-plane.example".into()));
    assert_refused(&cp, &vm, "cloud-audience");
    set(&|m| m.iss = "https://evil.example".into());
    assert_refused(&cp, &vm, "cloud-issuer");
    set(&|m| m.iat_offset = -11 * 60);
    assert_refused(&cp, &vm, "cloud-stale");
    set(&|m| m.iat_offset = 5 * 60);
    assert_refused(&cp, &vm, "cloud-future");
    // A JWT in shape only: the agent forwards it, the server refuses
    // `alg: none` (and anything but RS256) before any other check.
    set(&|m| m.raw = Some(format!("{}.e30.c2ln", B64.encode(r#"{"alg":"none"}"#))));
    assert_refused(&cp, &vm, "cloud-malformed");
    // Signed claims without the compute_engine part (format=standard).
    set(&|m| m.standard = true);
    assert_refused(&cp, &vm, "cloud-malformed");
    assert!(cp.nodes().is_empty(), "no refusal admitted anything");

    // The good document joins, into the default pool.
    set(&|_| {});
    let out = join(&vm);
    assert_ok(&out);
    let node_id = stdout(&out)
        .trim()
        .strip_prefix("joined as ")
        .expect("joined as")
        .to_owned();
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["nodeId"], node_id.as_str());
    assert_eq!(nodes[0]["pool"], "default", "{nodes:?}");
    assert_eq!(vm.status_json()["nodeId"], node_id.as_str());

    // The same token replayed by another machine, then a fresh token for
    // the same instance: the instance admitted once, ever.
    let replayer = gcp_vm(&cp, &md.url);
    let last = mint.lock().expect("mint").last.clone();
    set(&|m| m.raw = last.clone());
    assert_refused(&cp, &replayer, "instance-reused");
    set(&|_| {});
    assert_refused(&cp, &replayer, "instance-reused");
    // Another instance of the project still joins.
    set(&|m| m.instance = "4343434343".into());
    assert_ok(&join(&replayer));
    assert_eq!(cp.nodes().len(), 2);

    let table = cp.json(&["cloud", "resolve", "list"]);
    assert_eq!(table.as_array().map(Vec::len), Some(2), "{table}");
}

#[test]
fn cloud_iid_refusals_and_errors_outside_the_happy_cloud() {
    let mint = Arc::new(Mutex::new(Mint::default()));
    let md = metadata_server(mint);
    // A control plane with no [cloud_iid] keys: GCP is unknown to it.
    let cp = ControlPlane::start();
    let vm = gcp_vm(&cp, &md.url);
    assert_refused(&cp, &vm, "cloud-unknown-provider");

    // No metadata service: the error names the provider and the address,
    // and nothing reaches the control plane.
    let down = gcp_vm(&cp, "http://127.0.0.1:1");
    let out = join(&down);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "GCP: cannot fetch the identity document from the metadata service http://127.0.0.1:1/"
        ),
        "{err}"
    );
    // Not a cloud VM at all (no DMI vendor bcd knows).
    let bare = Agent::new(&cp);
    let out = bare
        .command(&["join", "--attestor", "cloud-iid"])
        .env("BCD_SYSFS_ROOT", bare.root.path())
        .within();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a recognized cloud VM"),
        "{}",
        stderr(&out)
    );
    // No token is read with cloud-iid.
    let out = vm.run(&[
        "join",
        "--attestor",
        "cloud-iid",
        "--token-file",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(cp.refusal_reasons(), ["cloud-unknown-provider"]);
}

#[test]
fn an_aws_vm_joins_once_with_its_signed_document() {
    let mint = Arc::new(Mutex::new(Mint {
        project: "111122223333".into(),
        zone: "eu-west-1a".into(),
        instance: "i-0123456789abcdef0".into(),
        ..Mint::default()
    }));
    let md = metadata_server(mint.clone());
    let cp = ControlPlane::start_with_config(&format!(
        "[cloud_iid.aws]\ncertificates = \"{}\"\n",
        fixture("cloud-aws.pem")
    ));
    let ec2 = ["Amazon EC2", "t3.micro", "Amazon EC2"];
    let vm1 = vm(&cp, &md.url, ec2);
    let set = |f: &dyn Fn(&mut Mint)| f(&mut mint.lock().expect("mint"));

    assert_refused(&cp, &vm1, "unknown-instance");
    // A zone row for another zone does not cover it; the right one does.
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "aws",
        "--account",
        "111122223333",
        "--zone",
        "eu-west-1b",
    ]));
    assert_refused(&cp, &vm1, "unknown-instance");
    // Into a pool that admits only cloud-iid: the pool's policy takes it.
    assert_ok(&cp.cli(&[
        "pools",
        "create",
        "--id",
        "ec2",
        "--join-attestors",
        "cloud-iid",
    ]));
    assert_ok(&cp.cli(&[
        "cloud",
        "resolve",
        "add",
        "--provider",
        "aws",
        "--account",
        "111122223333",
        "--zone",
        "eu-west-1a",
        "--pool",
        "ec2",
    ]));
    set(&|m| m.trusted_key = false);
    assert_refused(&cp, &vm1, "cloud-signature");
    set(&|m| {
        m.trusted_key = true;
        m.tampered = true;
    });
    assert_refused(&cp, &vm1, "cloud-signature");
    set(&|m| m.tampered = false);
    assert_ok(&join(&vm1));
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["pool"], "ec2", "{nodes:?}");
    // The document is readable by any process on the VM, and never
    // changes: a copy on another machine is refused for good.
    let copy = vm(&cp, &md.url, ec2);
    assert_refused(&cp, &copy, "instance-reused");
    // A GCP VM: this control plane has no keys for GCP.
    let gcp = gcp_vm(&cp, &md.url);
    assert_refused(&cp, &gcp, "cloud-unknown-provider");
}
