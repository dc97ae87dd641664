//! cloud-iid's generic OIDC provider (`[cloud_iid.oidc.<name>]`): a local
//! HTTPS issuer (a real TLS listener with its own test CA, which the
//! control plane trusts through `ca_bundle`) publishes its
//! openid-configuration and JWKS; the test signs ES256 ID tokens with its
//! key and puts them where bcd reads them (`[cloud] provider = "oidc:wi"`,
//! `token_file`). Real bcd, real control plane, real fetches: every refusal
//! is seen at the server by its reason and at the agent as ACCESS_DENIED.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use p256::ecdsa::signature::Signer as _;
use serde_json::json;

use crate::cloud_iid::assert_refused;
use crate::harness::*;

/// The issuer: its URL, the file of its CA (PEM), its signing key, and how
/// many times its JWKS was fetched.
pub(crate) struct Issuer {
    _server: InProcessServer,
    pub url: String,
    pub ca_file: tempfile::NamedTempFile,
    key: p256::ecdsa::SigningKey,
    jwks_fetches: Arc<AtomicUsize>,
}

/// The JWK of `key` as `kid`.
fn jwk(key: &p256::ecdsa::SigningKey, kid: &str) -> serde_json::Value {
    let point = key.verifying_key().to_sec1_point(false);
    let b = point.as_bytes();
    json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": B64.encode(&b[1..33]), "y": B64.encode(&b[33..65]),
    })
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs() as i64
}

impl Issuer {
    /// Serves `/.well-known/openid-configuration` (naming `/jwks` on its own
    /// host) and `/jwks`, and under `/offhost` a configuration whose
    /// `jwks_uri` is on another host.
    pub(crate) fn start() -> Issuer {
        let bc_test_support::tls::LoopbackTls {
            ca: ca_cert,
            server: tls,
        } = bc_test_support::tls::loopback_tls("bcd e2e OIDC issuer CA");
        let key = p256::ecdsa::SigningKey::from_slice(&[0x42; 32]).unwrap();
        let jwks = json!({ "keys": [jwk(&key, "k1")] }).to_string();
        let jwks_fetches = Arc::new(AtomicUsize::new(0));
        let fetches = jwks_fetches.clone();
        // The port is known only once the server listens: the handlers read
        // it from the request's Host.
        let conf =
            |headers: axum::http::HeaderMap, path: &'static str, host: Option<&'static str>| {
                let own = headers
                    .get("host")
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let port = own.rsplit(':').next().unwrap_or_default().to_owned();
                json!({
                    "issuer": format!("https://{own}{path}"),
                    "jwks_uri": match host {
                        Some(h) => format!("https://{h}:{port}/jwks"),
                        None => format!("https://{own}/jwks"),
                    },
                })
                .to_string()
            };
        let router = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(
                    move |h: axum::http::HeaderMap| async move { conf(h, "", None) },
                ),
            )
            .route(
                "/offhost/.well-known/openid-configuration",
                axum::routing::get(move |h: axum::http::HeaderMap| async move {
                    conf(h, "/offhost", Some("localhost"))
                }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    async move { jwks }
                }),
            );
        let server = InProcessServer::start(Arc::new(tls), router);
        let ca_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca_file.path(), ca_cert.pem()).unwrap();
        Issuer {
            url: server.url.clone(),
            _server: server,
            ca_file,
            key,
            jwks_fetches,
        }
    }

    pub(crate) fn jwks_fetches(&self) -> usize {
        self.jwks_fetches.load(Ordering::SeqCst)
    }

    /// The `[cloud_iid.oidc.wi]` (and `offhost`) tables of a control plane
    /// at `cp_url`: the account from `tenant`, the zone from `zone`.
    pub(crate) fn config(&self, cp_url: &str) -> String {
        format!(
            "[cloud_iid]\naudience = \"{cp_url}\"\n\
             [cloud_iid.oidc.wi]\nissuer = \"{url}\"\nca_bundle = \"{ca}\"\ntimeout = \"5s\"\n\
             account_claim = \"tenant\"\nzone_claim = \"zone\"\n\
             [cloud_iid.oidc.offhost]\nissuer = \"{url}/offhost\"\nca_bundle = \"{ca}\"\ntimeout = \"5s\"\n",
            url = self.url,
            ca = self.ca_file.path().display()
        )
    }

    /// An ES256 token with these claims over the defaults (`None` removes one).
    pub(crate) fn token(&self, cp_url: &str, over: &[(&str, Option<serde_json::Value>)]) -> String {
        self.token_signed(&self.key, "k1", cp_url, over)
    }

    fn token_signed(
        &self,
        key: &p256::ecdsa::SigningKey,
        kid: &str,
        cp_url: &str,
        over: &[(&str, Option<serde_json::Value>)],
    ) -> String {
        let now = now_s();
        let mut claims = json!({
            "iss": self.url, "aud": cp_url, "sub": "vm-7", "iat": now, "nbf": now,
            "exp": now + 3600, "tenant": "acme", "zone": "zone-a",
        });
        for (k, v) in over {
            match v {
                Some(v) => claims[*k] = v.clone(),
                None => {
                    claims.as_object_mut().unwrap().remove(*k);
                }
            }
        }
        let header = json!({ "alg": "ES256", "kid": kid, "typ": "JWT" });
        let signed = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig: p256::ecdsa::Signature = key.sign(signed.as_bytes());
        format!("{signed}.{}", B64.encode(sig.to_bytes()))
    }
}

/// A machine whose `[cloud]` names `provider` and a token file; the token
/// is written with [`put_token`].
pub(crate) fn oidc_vm(cp: &ControlPlane, provider: &str) -> Agent {
    let agent = Agent::new(cp);
    let mut config = std::fs::read_to_string(&agent.config).expect("config");
    config.push_str(&format!(
        "\n[cloud]\nprovider = \"{provider}\"\ntoken_file = \"{}\"\n",
        agent.root.path().join("id-token").display()
    ));
    std::fs::write(&agent.config, config).expect("write config");
    agent
}

pub(crate) fn put_token(agent: &Agent, token: &str) {
    std::fs::write(agent.root.path().join("id-token"), format!("{token}\n")).expect("token");
}

pub(crate) fn resolve(cp: &ControlPlane, extra: &[&str]) {
    assert_ok(&resolve_add(cp, extra));
}

/// `cloud resolve add --provider oidc:wi --account acme EXTRA…`.
fn resolve_add(cp: &ControlPlane, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "cloud",
        "resolve",
        "add",
        "--provider",
        "oidc:wi",
        "--account",
        "acme",
    ];
    args.extend_from_slice(extra);
    cp.cli(&args)
}

#[test]
fn an_oidc_token_joins_once_and_every_bad_one_is_refused_by_its_reason() {
    let issuer = Issuer::start();
    let cp = ControlPlane::start_with_config_for_url(|url| issuer.config(url));
    let vm = oidc_vm(&cp, "oidc:wi");
    let url = cp.url.clone();

    // Verified (the keys fetched once), but no resolve row covers acme.
    put_token(&vm, &issuer.token(&url, &[]));
    assert_refused(&cp, &vm, "unknown-instance");
    assert_eq!(issuer.jwks_fetches(), 1);
    resolve(&cp, &[]);

    let other = p256::ecdsa::SigningKey::from_slice(&[0x43; 32]).unwrap();
    let refusals: Vec<(String, &str)> = vec![
        // Another key under the issuer's kid, and a kid it never published.
        (
            issuer.token_signed(&other, "k1", &url, &[]),
            "cloud-signature",
        ),
        (
            issuer.token_signed(&other, "k2", &url, &[]),
            "cloud-signature",
        ),
        (
            issuer.token(&url, &[("aud", Some(json!("https://another-cp.example")))]),
            "cloud-audience",
        ),
        (
            issuer.token(&url, &[("iss", Some(json!("https://evil.example")))]),
            "cloud-issuer",
        ),
        (
            issuer.token(&url, &[("exp", Some(json!(now_s() - 1)))]),
            "cloud-stale",
        ),
        (
            issuer.token(&url, &[("iat", Some(json!(now_s() - 11 * 60)))]),
            "cloud-stale",
        ),
        (
            issuer.token(&url, &[("nbf", Some(json!(now_s() + 5 * 60)))]),
            "cloud-future",
        ),
        (issuer.token(&url, &[("tenant", None)]), "cloud-malformed"),
    ];
    for (token, reason) in &refusals {
        put_token(&vm, token);
        assert_refused(&cp, &vm, reason);
    }
    // The unknown kid fetched nothing more: the keys were fetched less
    // than a minute ago.
    assert_eq!(issuer.jwks_fetches(), 1);
    assert!(cp.nodes().is_empty(), "no refusal admitted anything");

    let token = issuer.token(&url, &[]);
    put_token(&vm, &token);
    let out = crate::cloud_iid::join(&vm);
    assert_ok(&out);
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["attestor"], "cloud-iid", "{nodes:?}");
    assert_eq!(vm.status_json()["nodeId"], nodes[0]["nodeId"]);

    // The same token on another machine, then a fresh one for the same
    // instance: admitted once, ever. Another instance joins.
    let copy = oidc_vm(&cp, "oidc:wi");
    put_token(&copy, &token);
    assert_refused(&cp, &copy, "instance-reused");
    put_token(&copy, &issuer.token(&url, &[]));
    assert_refused(&cp, &copy, "instance-reused");
    put_token(&copy, &issuer.token(&url, &[("sub", Some(json!("vm-8")))]));
    assert_ok(&crate::cloud_iid::join(&copy));
    assert_eq!(cp.nodes().len(), 2);
    assert_eq!(issuer.jwks_fetches(), 1, "the keys are cached");

    // A provider whose jwks_uri is off the issuer's host: never fetched,
    // the join refused cloud-jwks.
    let off = oidc_vm(&cp, "oidc:offhost");
    put_token(&off, &issuer.token(&url, &[]));
    assert_refused(&cp, &off, "cloud-jwks");
    assert_eq!(issuer.jwks_fetches(), 1);
    // A provider this control plane does not have.
    let unknown = oidc_vm(&cp, "oidc:nobody");
    put_token(&unknown, &issuer.token(&url, &[]));
    assert_refused(&cp, &unknown, "cloud-unknown-provider");
}

#[test]
fn bcd_reads_the_token_file_and_never_prints_it() {
    let issuer = Issuer::start();
    let cp = ControlPlane::start_with_config_for_url(|url| issuer.config(url));
    let vm = oidc_vm(&cp, "oidc:wi");
    // No file yet: the error names it, nothing reaches the control plane.
    let out = crate::cloud_iid::join(&vm);
    assert!(!out.status.success());
    let path = vm.root.path().join("id-token");
    assert!(
        stderr(&out).contains(&format!("[cloud] token_file {}", path.display())),
        "{}",
        stderr(&out)
    );
    // Not a JWT: refused by bcd, without echoing it.
    put_token(&vm, "s3cr3t-not-a-jwt");
    let out = crate::cloud_iid::join(&vm);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a JWT"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("s3cr3t"), "{}", stderr(&out));
    assert!(cp.refusal_reasons().is_empty());
    // A refused join does not print the token either.
    let token = issuer.token(&cp.url, &[]);
    put_token(&vm, &token);
    let out = cp.refused_once(Refusal::Join("cloud-iid"), "unknown-instance", || {
        crate::cloud_iid::join(&vm)
    });
    assert_access_denied(&out);
    let sig = token.rsplit('.').next().unwrap();
    assert!(!stderr(&out).contains(sig) && !stdout(&out).contains(sig));
}

/// `bcd join --attestor cloud-iid --role site`.
fn join_as_site(agent: &Agent) -> std::process::Output {
    agent
        .command(&["join", "--attestor", "cloud-iid", "--role", "site"])
        .within()
}

/// A resolve row that names a site (`--site-from zone`: the site the
/// token's zone claim names) admits its VMs as site nodes of that site, and
/// only so; one admitted takes its site's boot lease with `bcd site`.
#[test]
fn a_cloud_vm_admitted_as_site_holds_its_sites_boot_lease() {
    let issuer = Issuer::start();
    let cp = ControlPlane::start_with_config_for_url(|url| issuer.config(url));
    let site_id = crate::discovery::site(&cp, "zone-a");
    let url = cp.url.clone();

    // A site that does not exist is refused by the command.
    let out = resolve_add(&cp, &["--site", "nowhere"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no site \"nowhere\""),
        "{}",
        stderr(&out)
    );
    resolve(&cp, &["--site-from", "zone"]);
    let table = cp.json(&["cloud", "resolve", "list"]);
    assert_eq!(table[0]["siteFrom"], "zone", "{table}");

    // A zone that names no site: refused, nothing spent.
    let vm = oidc_vm(&cp, "oidc:wi");
    put_token(&vm, &issuer.token(&url, &[("zone", Some(json!("zone-b")))]));
    let out = cp.refused_once(Refusal::Join("cloud-iid"), "unknown-instance", || {
        join_as_site(&vm)
    });
    assert_access_denied(&out);
    vm.assert_nothing_written();
    // A row for that zone naming a site (by name) places it there.
    let out = resolve_add(
        &cp,
        &["--zone", "zone-b", "--site", "zone-a", "--role", "site"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "--role with --site: {}",
        stderr(&out)
    );
    resolve(&cp, &["--zone", "zone-b", "--site", "zone-a"]);
    let vm_b = oidc_vm(&cp, "oidc:wi");
    put_token(
        &vm_b,
        &issuer.token(
            &url,
            &[
                ("zone", Some(json!("zone-b"))),
                ("sub", Some(json!("vm-b"))),
            ],
        ),
    );
    assert_ok(&join_as_site(&vm_b));
    assert_eq!(cp.nodes()[0]["site"], site_id.as_str());

    // The site fixes the role: not as a plain node.
    put_token(&vm, &issuer.token(&url, &[]));
    let out = cp.refused_once(Refusal::Join("cloud-iid"), "cloud-role", || {
        crate::cloud_iid::join(&vm)
    });
    assert_access_denied(&out);

    assert_ok(&join_as_site(&vm));
    let status = vm.status_json();
    assert_eq!(status["role"], "site");
    let node_id = status["nodeId"].as_str().expect("nodeId").to_owned();
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 2);
    let row = nodes
        .iter()
        .find(|n| n["nodeId"] == node_id.as_str())
        .expect("listed");
    assert_eq!(row["site"], site_id.as_str(), "{nodes:?}");

    let node = crate::discovery::SiteNode {
        agent: vm,
        site_id: site_id.clone(),
    };
    let mut server = crate::site::BootServer::start(&node);
    server.wait_for("boot lease acquired");
}

/// A known instance (`cloud resolve add --instance --node`) joins as its
/// node, whatever the account's rows say; one whose node was retired is
/// refused as a reclaim of a retired node is.
#[test]
fn a_known_instance_joins_as_its_node() {
    let issuer = Issuer::start();
    let cp = ControlPlane::start_with_config_for_url(|url| issuer.config(url));
    let url = cp.url.clone();
    let joined = |agent: &Agent| {
        assert_ok(&output_within(
            agent.token_join(&cp.token("node", &[]), &[]),
            DEADLINE,
        ));
        agent.status_json()["nodeId"]
            .as_str()
            .expect("nodeId")
            .to_owned()
    };
    let old = Agent::new(&cp);
    let node_id = joined(&old);

    let add =
        |instance: &str, node: &str| resolve_add(&cp, &["--instance", instance, "--node", node]);
    let out = add("vm-9", "node_nope");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no node \"node_nope\""),
        "{}",
        stderr(&out)
    );
    assert_ok(&add("vm-9", &node_id));
    let table = cp.json(&["cloud", "resolve", "list"]);
    assert_eq!(table[0]["instance"], "vm-9", "{table}");
    assert_eq!(table[0]["node"], node_id.as_str(), "{table}");

    // No row covers acme: the instance alone places it, as its node.
    let vm = oidc_vm(&cp, "oidc:wi");
    put_token(&vm, &issuer.token(&url, &[("sub", Some(json!("vm-9")))]));
    let out = crate::cloud_iid::join(&vm);
    assert_ok(&out);
    assert_eq!(vm.status_json()["nodeId"], node_id.as_str());
    assert_eq!(cp.nodes().len(), 1, "no new node");
    // Once: the instance is spent.
    let again = oidc_vm(&cp, "oidc:wi");
    put_token(&again, &issuer.token(&url, &[("sub", Some(json!("vm-9")))]));
    assert_refused(&cp, &again, "instance-reused");

    // A node retired after its instance was named: refused, nothing spent.
    let other = Agent::new(&cp);
    let other_id = joined(&other);
    assert_ok(&add("vm-10", &other_id));
    assert_ok(&cp.cli(&["nodes", "retire", &other_id]));
    let vm10 = oidc_vm(&cp, "oidc:wi");
    put_token(&vm10, &issuer.token(&url, &[("sub", Some(json!("vm-10")))]));
    let out = cp.refused_once(Refusal::Join("cloud-iid"), "join:reclaim-retired", || {
        crate::cloud_iid::join(&vm10)
    });
    assert_access_denied(&out);
    vm10.assert_nothing_written();
    // And the command no longer names it.
    let out = add("vm-11", &other_id);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is retired"), "{}", stderr(&out));
}

/// A resolve rule naming a tenant (`--tenant`): checked against its pool
/// (without `--pool`, the tenant's only pool), listed with it, and the VM
/// it admits joins that pool, its join attributed to the tenant.
#[test]
fn a_rule_naming_a_tenant_joins_the_vm_into_the_tenants_pool() {
    let issuer = Issuer::start();
    let cp = ControlPlane::start_with_config_for_url(|url| issuer.config(url));
    let add = |extra: &[&str]| resolve_add(&cp, extra);
    let refused = |out: std::process::Output, why: &str| {
        assert_eq!(out.status.code(), Some(1), "{why}");
        assert!(stderr(&out).contains(why), "{why}: {}", stderr(&out));
    };
    refused(add(&["--tenant", "acme"]), r#"no tenant "acme""#);
    assert_ok(&cp.cli(&["tenants", "create", "acme"]));
    refused(add(&["--tenant", "acme"]), "owns no pool");
    assert_ok(&cp.cli(&["pools", "create", "--id", "metal", "--tenant", "acme"]));
    refused(
        add(&["--tenant", "acme", "--pool", "default"]),
        r#"pool "default" belongs to tenant "root", not "acme""#,
    );
    assert!(cp
        .json(&["cloud", "resolve", "list"])
        .as_array()
        .unwrap()
        .is_empty());
    assert_ok(&add(&["--tenant", "acme"]));
    let table = cp.json(&["cloud", "resolve", "list"]);
    assert_eq!(table[0]["pool"], "metal", "{table}");
    assert_eq!(table[0]["tenant"], "acme", "{table}");

    let vm = oidc_vm(&cp, "oidc:wi");
    put_token(&vm, &issuer.token(&cp.url, &[]));
    assert_ok(&crate::cloud_iid::join(&vm));
    let nodes = cp.nodes();
    assert_eq!(nodes[0]["pool"], "metal", "{nodes:?}");
    let events = cp.json(&["events", "list", "--tenant", "acme"]);
    let joined: Vec<&serde_json::Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "node.joined")
        .collect();
    assert_eq!(joined.len(), 1, "{events}");
    assert_eq!(joined[0]["nodeId"], nodes[0]["nodeId"], "{events}");
}
