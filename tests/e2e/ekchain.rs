//! EK certificates issued by the maker's intermediate, with only the
//! maker's root configured at the control plane: the intermediate found in
//! the TPM's EK chain NV index, in `[tpm] ek_intermediates`, or nowhere.

use crate::harness::*;
use crate::maker::nv_write;
use std::process::Command;

/// A control plane that knows only the test maker's root.
fn trusting_root_only() -> ControlPlane {
    let cp = ControlPlane::start_with_config("[tpm]\nenrollment_retry_after = \"1s\"\n");
    let out = cp.cli(&["ek-roots", "add", &fixture("ek-root.pem")]);
    assert_ok(&out);
    assert!(stdout(&out).contains(" anchor "), "{}", stdout(&out));
    cp
}

/// The intermediate's DER.
fn intermediate_der() -> Vec<u8> {
    let pem = std::fs::read(fixture("ek-intermediate.pem")).unwrap();
    ::pem::parse(pem).unwrap().into_contents()
}

#[test]
fn the_intermediate_in_the_ek_chain_nv_index_joins() {
    let cp = trusting_root_only();
    let tpm = Swtpm::start();
    nv_write(&tpm, "0x01c00100", &intermediate_der());
    let agent = Agent::tpm_joined(&cp, &tpm);
    assert!(agent.status_json()["nodeId"].is_string());
}

#[test]
fn the_intermediate_in_ek_intermediates_joins() {
    let cp = trusting_root_only();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let bundle = agent.root.path().join("ek-intermediates.pem");
    std::fs::copy(fixture("ek-intermediate.pem"), &bundle).unwrap();
    let config = std::fs::read_to_string(&agent.config).unwrap();
    // [tpm] is the config's last table.
    std::fs::write(
        &agent.config,
        format!("{config}ek_intermediates = \"{}\"\n", bundle.display()),
    )
    .unwrap();
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
}

#[test]
fn the_intermediate_nowhere_is_refused_ek_chain() {
    let cp = trusting_root_only();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    assert!(cp.log().contains("ek-chain"), "{}", cp.log());

    // bcd doctor, checking against the root, names the missing issuer.
    let config = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(
        &agent.config,
        format!("{config}ek_roots = \"{}\"\n", fixture("ek-root.pem")),
    )
    .unwrap();
    let out = agent.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("no path: the issuer C=XX, O=BCD Test TPM Manufacturer, CN=BCD Test EK Issuing CA 01 is missing"),
        "{}",
        stdout(&out)
    );
    // With the intermediate in NV, the doctor finds the path too.
    nv_write(&tpm, "0x01c00100", &intermediate_der());
    let out = agent.run(&["doctor"]);
    assert!(
        stdout(&out)
            .contains("ok    ek certificate: joins as nv-chain: from NV 0x01c00002, issued by"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn an_ek_certificate_behind_the_tcg_nv_header_joins() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek_sha256 = agent.allow_ek(&cp);
    // Read the certificate, then store it again behind `10 01 00 <len>`.
    let der = tpm.dir.path().join("ek.der");
    assert_ok(&tpm.tool(
        "tpm2_nvread",
        &["0x01c00002", "-C", "o", "-o", &der.to_string_lossy()],
    ));
    let der = std::fs::read(der).unwrap();
    let len = usize::from(der[2]) << 8 | usize::from(der[3]);
    let der = &der[..len + 4];
    let mut wrapped = vec![0x10, 0x01, 0x00, (der.len() >> 8) as u8, der.len() as u8];
    wrapped.extend_from_slice(der);
    assert_ok(&tpm.tool("tpm2_nvundefine", &["0x01c00002", "-C", "p"]));
    nv_write(&tpm, "0x01c00002", &wrapped);
    assert_eq!(agent.identify()["ekSha256"], ek_sha256.as_str());
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
}

/// `ek-roots add DIR` reads only the regular files of DIR: a FIFO (which
/// blocked the command for ever) and a link to /dev/zero (read until memory
/// ran out) are skipped by name with the reason, promptly, and the real
/// root is added. A FIFO named alone is an error naming it.
#[test]
fn ek_roots_add_skips_a_fifo_and_a_link_to_dev_zero() {
    let cp = ControlPlane::start();
    let dir = cp.path().join("ek-cas");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(fixture("ek-root.pem"), dir.join("root.pem")).unwrap();
    let fifo = dir.join("fifo.pem");
    assert_ok(&Command::new("mkfifo").arg(&fifo).within());
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.pem")).unwrap();

    let quick = std::time::Duration::from_secs(30);
    let add = |path: &std::path::Path| {
        let mut cmd = Command::new(bin("bc-controlplane"));
        cmd.args(["ek-roots", "add", "--dir"])
            .arg(cp.path())
            .arg(path)
            .stdin(std::process::Stdio::null());
        output_within(cmd, quick)
    };
    let out = add(&dir);
    assert_ok(&out);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(
        lines[0],
        format!(
            "{}: skipped: it is a FIFO, not a regular file",
            fifo.display()
        )
    );
    assert!(
        lines[1].starts_with(&format!("{}: added ", dir.join("root.pem").display()))
            && lines[1].contains(" anchor "),
        "{text}"
    );
    assert_eq!(
        lines[2],
        format!(
            "{}: skipped: it is a symbolic link, which is not followed here: name the file itself",
            dir.join("zero.pem").display()
        )
    );
    assert_eq!(cp.json(&["ek-roots", "list"]).as_array().unwrap().len(), 1);

    let out = add(&fifo);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "{}: it is a FIFO, not a regular file",
            fifo.display()
        )),
        "{}",
        stderr(&out)
    );
}
