//! The control plane's packages (`dist add`, `GET /dist/<name>`) and the
//! install script it writes: what the script pins, that it parses (and
//! passes shellcheck when installed), and that against the real control
//! plane it refuses a package whose hash differs and a server whose CA
//! differs, before it installs anything. Running it for real (install,
//! join, units) is scripts/vmtest's job, in a guest.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

use crate::harness::{assert_ok, stderr, stdout, ControlPlane, Within as _};

const PACKAGE: &str = "bcd_0.1.0+test_amd64.deb";

/// A control plane serving a package (any bytes do: nothing here installs it).
fn with_package(bytes: &[u8]) -> (ControlPlane, tempfile::TempDir) {
    let cp = ControlPlane::start();
    let files = tempfile::tempdir().expect("tempdir");
    let deb = files.path().join(PACKAGE);
    std::fs::write(&deb, bytes).expect("write package");
    let out = cp.cli(&["dist", "add", deb.to_str().expect("utf-8")]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out).trim(),
        format!(
            "added {PACKAGE} sha256 {}",
            hex::encode(Sha256::digest(bytes))
        )
    );
    (cp, files)
}

fn script(cp: &ControlPlane, api: &str, attestor: &str) -> String {
    let out = cp.cli(&["install-script", "--api", api, "--attestor", attestor]);
    assert_ok(&out);
    stdout(&out)
}

/// `curl` pinned to the control plane's CA: (HTTP status, body).
fn get(cp: &ControlPlane, path: &str) -> (String, Vec<u8>) {
    let body = cp.path().join("download");
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--path-as-is", "--cacert"])
        .arg(cp.path().join("tls-ca.pem"))
        .args(["--write-out", "%{http_code}", "--output"])
        .arg(&body)
        .arg(format!("{}{path}", cp.url))
        .within();
    assert_ok(&out);
    let bytes = std::fs::read(&body).unwrap_or_default();
    let _ = std::fs::remove_file(&body);
    (stdout(&out), bytes)
}

#[test]
fn dist_serves_recorded_packages_and_nothing_else() {
    let (cp, _files) = with_package(b"the package bytes");
    assert_eq!(
        get(&cp, &format!("/dist/{PACKAGE}")),
        ("200".into(), b"the package bytes".to_vec())
    );
    for path in [
        "/dist/current",
        "/dist/bcd_9.9_amd64.deb",
        &format!("/dist/{PACKAGE}.sha256"),
        "/dist/..%2fcontrolplane.db",
        "/dist/../controlplane.db",
        "/dist/%2e%2e%2ftls-ca.key",
        "/dist/.deb",
    ] {
        assert_ne!(get(&cp, path).0, "200", "{path} was served");
    }
    // A file changed behind the control plane's back is not served.
    std::fs::write(cp.path().join("dist").join(PACKAGE), b"other bytes").expect("write");
    assert_eq!(get(&cp, &format!("/dist/{PACKAGE}")).0, "500");
}

/// The resident memory of a process, from `/proc/<pid>/status` (VmRSS).
fn vm_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A TLS client of the control plane that asks for `path`, reads the
/// status line, and then reads nothing more: a slow reader.
fn stalled_reader(
    cp: &ControlPlane,
    config: &std::sync::Arc<rustls::ClientConfig>,
    path: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    use std::io::{Read, Write};
    let addr = cp.url.strip_prefix("https://").expect("https URL");
    let tcp = std::net::TcpStream::connect(addr).expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let conn = rustls::ClientConnection::new(config.clone(), name).expect("client");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").expect("request");
    tls.flush().expect("flush");
    let mut head = [0u8; 12];
    tls.read_exact(&mut head).expect("status line");
    assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
    tls
}

fn client_config(cp: &ControlPlane) -> std::sync::Arc<rustls::ClientConfig> {
    let pem = std::fs::read(cp.path().join("tls-ca.pem")).expect("CA");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.expect("CA PEM")).expect("CA");
    }
    std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// Readers that stop reading share the one verified copy of the package:
/// as many as one address may have (16), each holding an 8 MiB download
/// open, leave the control plane's resident memory (VmRSS) within a few
/// MiB of where one complete download put it, where a copy per reader
/// would add 128 MiB; one more from that address is refused (503) until
/// they are gone.
#[test]
fn slow_readers_share_one_copy_of_the_package() {
    const SIZE: usize = 8 << 20;
    // Incompressible, deterministic bytes.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let (cp, _files) = with_package(&bytes);
    let path = format!("/dist/{PACKAGE}");
    let (status, body) = get(&cp, &path);
    assert_eq!((status.as_str(), body.len()), ("200", SIZE));
    let before = vm_rss_bytes(cp.pid());

    let config = client_config(&cp);
    let readers: Vec<_> = (0..16)
        .map(|_| stalled_reader(&cp, &config, &path))
        .collect();
    let after = vm_rss_bytes(cp.pid());
    let grown = after.saturating_sub(before);
    eprintln!(
        "VmRSS after one download {} KiB, with 16 stalled readers {} KiB (+{} KiB)",
        before / 1024,
        after / 1024,
        grown / 1024
    );
    assert!(
        grown < 2 * SIZE as u64,
        "16 stalled readers grew the control plane by {} MiB",
        grown >> 20
    );
    assert_eq!(get(&cp, &path).0, "503", "a 17th download from one address");

    // Once they are gone, the address downloads again.
    drop(readers);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, body) = get(&cp, &path);
        if status == "200" {
            assert_eq!(body, bytes);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {status}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn install_script_pins_ca_hash_and_config_and_parses() {
    let bytes = b"package for the script";
    let (cp, _files) = with_package(bytes);
    let ca = std::fs::read_to_string(cp.path().join("tls-ca.pem")).expect("CA");
    let hash = hex::encode(Sha256::digest(bytes));
    for attestor in ["tpm", "join-token", "provisioned"] {
        let text = script(&cp, "https://cp.example:8443", attestor);
        assert!(text.starts_with("#!/bin/sh\n"));
        assert!(text.contains(&ca), "{attestor}: the CA is embedded");
        assert!(text.contains(&format!("package_sha256='{hash}'")));
        assert!(text.contains(&format!("package='{PACKAGE}'")));
        assert!(
            text.contains("api = \"https://cp.example:8443\""),
            "the config pins the API"
        );
        assert!(text.contains("join_signing_key = \"\"\""));
        assert!(text.contains("--cacert \"$work/ca.pem\""));
        assert!(text.contains("gpasswd -d bcd tss"));
        assert!(text.contains("already joined as $node"));
        let path = cp.path().join(format!("install-{attestor}.sh"));
        std::fs::write(&path, &text).expect("write script");
        assert_ok(&Command::new("sh").arg("-n").arg(&path).within());
        // Not optional: scripts/lib.sh installs shellcheck.
        assert_ok(
            &Command::new("shellcheck")
                .args(["-s", "sh"])
                .arg(&path)
                .within(),
        );
    }
    let tpm = script(&cp, "https://cp.example:8443", "tpm");
    assert!(tpm.contains("bcd join --config \"$config\" --attestor tpm </dev/null"));
    assert!(
        !tpm.contains("token_file") && !tpm.contains("BCD_TOKEN_FILE"),
        "a tpm script reads no token"
    );
    let cloud = script(&cp, "https://cp.example:8443", "cloud-iid");
    assert!(cloud.contains("bcd join --config \"$config\" --attestor cloud-iid </dev/null"));
    assert!(
        !cloud.contains("token_file") && !cloud.contains("BCD_TOKEN_FILE"),
        "a cloud-iid script reads no token"
    );
    let token = script(&cp, "https://cp.example:8443", "join-token");
    assert!(token.contains("token_file=${BCD_TOKEN_FILE:-/run/bcd/join-token}"));
    assert!(token.contains("--token-file \"$token_file\""));
    assert!(token.contains("rm -f \"$token_file\""));

    // Nothing to install yet, a URL that is no plain https origin: refused.
    let bare = ControlPlane::init_only();
    let out = bare.cli(&[
        "install-script",
        "--api",
        "https://cp.example",
        "--attestor",
        "tpm",
    ]);
    assert!(
        !out.status.success() && stderr(&out).contains("dist add"),
        "{}",
        stderr(&out)
    );
    for api in [
        "http://cp.example",
        "https://cp.example/x",
        "https://cp'$(id)",
    ] {
        let out = cp.cli(&["install-script", "--api", api, "--attestor", "tpm"]);
        assert!(!out.status.success(), "{api} accepted");
    }
}

#[test]
fn user_data_runs_the_script_and_carries_the_token_in_a_0600_file() {
    let (cp, files) = with_package(b"package");
    let out = cp.cli(&[
        "user-data",
        "--api",
        "https://cp.example",
        "--attestor",
        "tpm",
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.starts_with("#cloud-config\n"));
    assert!(text.contains("runcmd:\n  - [sh, /var/lib/bcd-install/install.sh]\n"));
    assert!(text.contains("      #!/bin/sh\n"));
    assert!(!text.contains("/run/bcd/join-token"));
    // A cloud image's user data: no secret at all.
    let out = cp.cli(&[
        "user-data",
        "--api",
        "https://cp.example",
        "--attestor",
        "cloud-iid",
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.contains("--attestor cloud-iid </dev/null"));
    assert!(!text.contains("/run/bcd/join-token"));

    let token_file = files.path().join("token");
    let token = cp.token("node", &[]);
    let secret = token
        .split_once('.')
        .expect("tok_<id>.<secret>")
        .1
        .to_owned();
    std::fs::write(&token_file, format!("{token}\n")).expect("write token");
    let out = cp.cli(&[
        "user-data",
        "--api",
        "https://cp.example",
        "--attestor",
        "join-token",
        "--token-file",
        token_file.to_str().expect("utf-8"),
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.contains(&format!(
        "  - path: /run/bcd/join-token\n    owner: root:root\n    permissions: '0600'\n    content: '{token}'\n"
    )));
    // The token is in the user data's file, never in the script.
    let script_part = text
        .split("/var/lib/bcd-install/install.sh\n")
        .nth(1)
        .expect("script");
    assert!(!script_part.contains(&secret));
    let out = cp.cli(&[
        "user-data",
        "--api",
        "https://cp.example",
        "--attestor",
        "join-token",
    ]);
    assert!(!out.status.success() && stderr(&out).contains("--token-file"));
}

/// User data outlives the join (the cloud's metadata service serves it for
/// the VM's life), so a token that could join again is refused there
/// unless the operator says so; so is a token this directory never issued.
/// A refusal prints nothing on stdout.
#[test]
fn user_data_refuses_a_multi_use_token_unless_allowed() {
    let (cp, files) = with_package(b"package");
    let token_file = files.path().join("token");
    let user_data = |extra: &[&str]| {
        let mut args = vec![
            "user-data",
            "--api",
            "https://cp.example",
            "--attestor",
            "join-token",
            "--token-file",
            token_file.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        cp.cli(&args)
    };
    let multi = cp.token("node", &["--uses", "3"]);
    std::fs::write(&token_file, &multi).expect("write token");
    let out = user_data(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        out.stdout.is_empty(),
        "printed on refusal: {}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("3 uses left")
            && err.contains("metadata service")
            && err.contains("--attestor provisioned")
            && err.contains("--allow-multi-use"),
        "{err}"
    );
    assert!(
        !err.contains(multi.split_once('.').unwrap().1),
        "the secret in an error"
    );
    // Said so: embedded.
    let out = user_data(&["--allow-multi-use"]);
    assert_ok(&out);
    assert!(stdout(&out).contains(&format!("content: '{multi}'")));

    // A token of another control plane, or not a token at all.
    let other = ControlPlane::init_only().token("node", &[]);
    std::fs::write(&token_file, &other).expect("write token");
    let out = user_data(&[]);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(
        stderr(&out).contains("has no token tok_"),
        "{}",
        stderr(&out)
    );
    std::fs::write(&token_file, "bcjt_secret.value").expect("write token");
    let out = user_data(&[]);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(
        stderr(&out).contains("does not hold one join token"),
        "{}",
        stderr(&out)
    );
}

/// A directory of stand-ins that record their calls and fail, put first
/// on PATH: if the script ever got past its checks it would only reach
/// these, never the host's package manager or systemd. `id -u` says 0 so
/// that the script runs the same as root or not.
fn stubs(dir: &Path) -> PathBuf {
    let bin = dir.join("stubs");
    std::fs::create_dir(&bin).expect("mkdir");
    let log = dir.join("calls.log");
    for tool in [
        "apt-get",
        "dpkg",
        "dpkg-query",
        "systemctl",
        "bcd",
        "gpasswd",
        "install",
    ] {
        let path = bin.join(tool);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"{tool} $*\" >>'{}'\nexit 1\n",
                log.display()
            ),
        )
        .expect("write stub");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let id = bin.join("id");
    std::fs::write(
        &id,
        "#!/bin/sh\n[ \"$1\" = -u ] && { echo 0; exit 0; }\nexec /usr/bin/id \"$@\"\n",
    )
    .expect("id");
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

fn run_script(text: &str, dir: &Path) -> Output {
    let path = dir.join("install.sh");
    std::fs::write(&path, text).expect("write script");
    script_command(Command::new("sh").arg(&path), dir)
}

/// The script's environment: the stubs first on PATH, no token file.
fn script_command(cmd: &mut Command, dir: &Path) -> Output {
    let stubs = stubs(dir);
    let path_env = format!(
        "{}:{}",
        stubs.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd.env("PATH", path_env)
        .env("BCD_TOKEN_FILE", dir.join("no-token"))
        .within()
}

/// The script on a machine without a TPM, whatever this host has: in a
/// mount namespace of its own where an empty regular file hides
/// /dev/tpmrm0 (tests run as root).
fn run_script_without_tpm(text: &str, dir: &Path) -> Output {
    if !Path::new("/dev/tpmrm0").exists() {
        return run_script(text, dir);
    }
    let path = dir.join("install.sh");
    std::fs::write(&path, text).expect("write script");
    let empty = dir.join("not-a-tpm");
    std::fs::write(&empty, b"").expect("write");
    let inner = format!(
        "mount --bind '{}' /dev/tpmrm0 && exec sh '{}'",
        empty.display(),
        path.display()
    );
    script_command(
        Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &inner]),
        dir,
    )
}

fn calls(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default()
}

#[test]
fn install_script_refuses_a_package_whose_hash_differs() {
    let (cp, _files) = with_package(b"the package the script pins");
    let text = script(&cp, &cp.url, "join-token");
    // The control plane now serves other bytes (as a compromised mirror
    // would): recorded and served consistently, but not what the script pins.
    let other = _files.path().join(PACKAGE);
    std::fs::write(&other, b"a package nobody pinned").expect("write");
    assert_ok(&cp.cli(&["dist", "add", other.to_str().expect("utf-8")]));
    assert_eq!(
        get(&cp, &format!("/dist/{PACKAGE}")).1,
        b"a package nobody pinned"
    );

    let work = tempfile::tempdir().expect("tempdir");
    let out = run_script(&text, work.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not the pinned") && stderr(&out).contains("refusing to install it"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        calls(work.path()),
        "",
        "nothing was installed, configured or started"
    );

    // The same script, with the package it pins served again, gets past the
    // hash to the install step (a stub here).
    let pinned = _files.path().join(PACKAGE);
    std::fs::write(&pinned, b"the package the script pins").expect("write");
    assert_ok(&cp.cli(&["dist", "add", pinned.to_str().expect("utf-8")]));
    let work = tempfile::tempdir().expect("tempdir");
    let out = run_script(&text, work.path());
    assert!(!out.status.success());
    assert!(
        calls(work.path()).starts_with("apt-get install -y -q --no-install-recommends "),
        "{}",
        calls(work.path())
    );
}

#[test]
fn install_script_trusts_only_its_control_planes_ca() {
    let (cp, _files) = with_package(b"package");
    let (other, _other_files) = with_package(b"package");
    // cp's script (cp's CA) pointed at the other control plane's URL.
    let text = script(&cp, &other.url, "join-token");
    let work = tempfile::tempdir().expect("tempdir");
    let out = run_script(&text, work.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot download"), "{}", stderr(&out));
    assert_eq!(calls(work.path()), "");
}

#[test]
fn tpm_install_script_stops_early_without_a_tpm() {
    let (cp, _files) = with_package(b"package");
    let work = tempfile::tempdir().expect("tempdir");
    let out = run_script_without_tpm(&script(&cp, &cp.url, "tpm"), work.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no TPM: /dev/tpmrm0 is missing"),
        "{}",
        stderr(&out)
    );
    assert_eq!(calls(work.path()), "");
}

/// `init --san`: the HTTPS certificate names the host machines reach
/// the control plane by (the install script's `--api`), besides loopback.
#[test]
fn init_sans_go_into_the_server_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(crate::harness::bin("bc-controlplane"))
        .args(["init", "--dir"])
        .arg(dir.path())
        .args(["--san", "10.0.2.100", "--san", "cp.example"])
        .within();
    assert_ok(&out);
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(dir.path().join("tls-server.pem"))
        .within();
    assert_ok(&out);
    let sans = stdout(&out);
    for name in [
        "DNS:localhost",
        "IP Address:127.0.0.1",
        "IP Address:10.0.2.100",
        "DNS:cp.example",
    ] {
        assert!(sans.contains(name), "{name} missing: {sans}");
    }
}
