//! `scripts/package`: the Debian package holds what an operator needs, its
//! Depends name the libraries the binary links, and every unit it ships
//! passes `systemd-analyze verify` and stays well hardened. (Installing,
//! upgrading and removing it is proven in a real guest: scripts/vmtest.)
//!
//! The package is made of the release build users get (`cargo build
//! --release -p bcd`), not the test build: `scripts/test` builds it first
//! and names it in `BCD_RELEASE_BCD` (its `package` stage runs this module
//! after the `release` stage). Run alone, the tests take
//! `target/release/bcd`, and fail, saying how to build it, if it is not there.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{assert_ok, stdout, workspace, Within as _};

const UNITS: &[&str] = &[
    "bcd-helper.service",
    "bcd-helper.socket",
    "bcd-node.service",
    "bcd-site.service",
];

/// The release bcd to package: `BCD_RELEASE_BCD` (scripts/test sets it),
/// else `target/release/bcd` beside this test build. Without either the
/// test fails and says how to build it: a package test that passes
/// without a package proves nothing.
fn release_bcd() -> PathBuf {
    let path = match std::env::var_os("BCD_RELEASE_BCD") {
        Some(path) => PathBuf::from(path),
        // target/debug/bcd → target/release/bcd
        None => PathBuf::from(env!("CARGO_BIN_EXE_bcd"))
            .parent()
            .and_then(Path::parent)
            .map(|t| t.join("release/bcd"))
            .expect("the test build's bcd sits in target/<profile>/"),
    };
    assert!(
        path.is_file(),
        "no release bcd at {}: run `cargo build --release --locked -p bcd` first \
         (or set BCD_RELEASE_BCD to one); scripts/test builds it and then runs this module",
        path.display()
    );
    eprintln!("packaging {}", path.display());
    path
}

/// Packages the release bcd into `out`; returns the .deb's path.
fn build_deb(out: &Path, version: &str) -> PathBuf {
    let run = Command::new(workspace().join("scripts/package"))
        .arg("--binary")
        .arg(release_bcd())
        .args(["--version", version, "--out"])
        .arg(out)
        .within();
    assert_ok(&run);
    let deb = PathBuf::from(stdout(&run).trim());
    assert_eq!(deb, out.join(format!("bcd_{version}_amd64.deb")));
    deb
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb").args(args).arg(deb).within();
    assert_ok(&out);
    stdout(&out)
}

#[test]
fn package_holds_binary_units_docs_and_depends() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let deb = build_deb(tmp.path(), "0.1.0+test1");

    let files = dpkg_deb(&["-c"], &deb);
    for path in [
        "./usr/bin/bcd",
        "./lib/systemd/system/bcd-helper.service",
        "./lib/systemd/system/bcd-helper.socket",
        "./lib/systemd/system/bcd-node.service",
        "./lib/systemd/system/bcd-site.service",
        "./usr/lib/sysusers.d/bcd.conf",
        "./usr/lib/tmpfiles.d/bcd.conf",
        "./usr/share/doc/bcd/config.toml.example",
        "./usr/share/doc/bcd/copyright",
        "./usr/share/man/man1/bcd.1.gz",
        "./usr/share/man/man1/bcd-join.1.gz",
        "./usr/share/bash-completion/completions/bcd",
        "./usr/share/zsh/vendor-completions/_bcd",
        "./usr/share/fish/vendor_completions.d/bcd.fish",
    ] {
        assert!(
            files.lines().any(|l| l.ends_with(path)),
            "{path} missing from the package:\n{files}"
        );
    }
    assert!(
        files.lines().all(|l| l.contains(" root/root ")),
        "every file is root's:\n{files}"
    );
    // Nothing under /var/lib or /etc: the identity and the config are the
    // machine's, never the package's (remove and upgrade keep them).
    assert!(!files.contains("./var/") && !files.contains("./etc/"));

    let control = dpkg_deb(&["-f"], &deb);
    assert!(control.contains("Package: bcd\n"), "{control}");
    assert!(control.contains("Version: 0.1.0+test1\n"), "{control}");
    assert!(control.contains("Architecture: amd64\n"), "{control}");
    let depends = control
        .lines()
        .find_map(|l| l.strip_prefix("Depends: "))
        .expect("a Depends field");
    // What `ldd bcd` lists, by package, and the TCTI libtss2 dlopen()s.
    for pkg in [
        "libc6 (>=",
        "libsqlite3-0 (>=",
        "libtss2-esys-3.0.2-0 (>=",
        "libtss2-mu0 (>=",
        "libtss2-tctildr0 (>=",
        "libtss2-tcti-device0",
    ] {
        assert!(depends.contains(pkg), "Depends lacks {pkg}: {depends}");
    }

    // The maintainer scripts parse, and removal keeps the identity.
    let control_dir = tmp.path().join("control");
    assert_ok(
        &Command::new("dpkg-deb")
            .arg("-e")
            .arg(&deb)
            .arg(&control_dir)
            .within(),
    );
    for script in ["postinst", "prerm", "postrm"] {
        let path = control_dir.join(script);
        assert_ok(&Command::new("sh").arg("-n").arg(&path).within());
        let text = std::fs::read_to_string(&path).expect("read script");
        assert!(
            !text.contains("rm -rf /var/lib/bcd"),
            "{script} deletes the identity"
        );
    }
    let postinst = std::fs::read_to_string(control_dir.join("postinst")).expect("postinst");
    assert!(postinst.contains("systemd-sysusers bcd.conf"));
    assert!(postinst.contains("gpasswd -d bcd tss"));
    assert!(postinst.contains("systemctl daemon-reload"));
}

/// `systemd-analyze verify` on every unit of the package, with the binary
/// path pointed at the unpacked package's bcd (verify checks that
/// ExecStart exists); `systemd-analyze security` keeps every service at
/// exposure 2.0 or below ("OK"), and the units say what the issue asks.
#[test]
fn package_units_verify_and_are_hardened() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let deb = build_deb(tmp.path(), "0.1.0");
    let root = tmp.path().join("root");
    assert_ok(
        &Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&root)
            .within(),
    );
    let units = tmp.path().join("units");
    std::fs::create_dir(&units).expect("mkdir");
    let bcd = root.join("usr/bin/bcd");
    for unit in UNITS {
        let text =
            std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).expect("unit");
        let text = text.replace("/usr/bin/bcd", bcd.to_str().expect("utf-8 path"));
        std::fs::write(units.join(unit), text).expect("write unit");
    }
    for unit in UNITS {
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(units.join(unit))
            .within();
        assert_ok(&out);
        assert!(
            crate::harness::stderr(&out).trim().is_empty(),
            "{unit}: {}",
            crate::harness::stderr(&out)
        );
    }
    for unit in UNITS.iter().filter(|u| u.ends_with(".service")) {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(units.join(unit))
            .within();
        let text = stdout(&out);
        let score: f64 = text
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no exposure level for {unit}: {text}"));
        assert!(score <= 2.0, "{unit}: exposure {score}\n{text}");
    }

    let unit = |name: &str| std::fs::read_to_string(units.join(name)).expect("unit");
    let helper = unit("bcd-helper.service");
    assert!(helper.contains("\nDevicePolicy=closed\n"));
    assert!(helper.contains("\nDeviceAllow=/dev/tpmrm0 rw\n"));
    assert_eq!(
        helper.matches("\nDeviceAllow=").count(),
        1,
        "only /dev/tpmrm0"
    );
    assert!(!helper.contains("\nUser="), "the helper runs as root");
    // ... in the group that owns /dev/tpmrm0, with no capability.
    assert!(helper.contains("\nSupplementaryGroups=tss\n"));
    assert!(helper.contains("\nCapabilityBoundingSet=\n"));

    let node = unit("bcd-node.service");
    assert!(!node.contains("SupplementaryGroups"));
    for line in [
        "\nUser=bcd\n",
        "\nPrivateDevices=yes\n",
        "\nNoNewPrivileges=yes\n",
        "\nProtectSystem=strict\n",
        "\nReadWritePaths=/var/lib/bcd\n",
        "\nPrivateTmp=yes\n",
        "\nCapabilityBoundingSet=\n",
    ] {
        assert!(node.contains(line), "bcd-node.service lacks {line:?}");
    }
    assert!(!node.contains("DeviceAllow"), "the node opens no device");
    let sysusers =
        std::fs::read_to_string(root.join("usr/lib/sysusers.d/bcd.conf")).expect("sysusers");
    assert!(sysusers.contains("u bcd "));
    let lines: Vec<&str> = sysusers.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        lines.iter().all(|l| !l.contains("tss")),
        "bcd is never put in tss: {lines:?}"
    );
    let tmpfiles =
        std::fs::read_to_string(root.join("usr/lib/tmpfiles.d/bcd.conf")).expect("tmpfiles");
    assert!(tmpfiles.contains("d /var/lib/bcd 0700 bcd bcd"));
    assert!(tmpfiles.contains("d /run/bcd "));
}

/// The project's bash scripts: the README's commands and what they call,
/// packaging, the VM and PXE tests, the ramdisk build, the fixtures.
const BASH_SCRIPTS: &[&str] = &[
    ".ci/run",
    "scripts/demo",
    "scripts/test",
    "scripts/lib.sh",
    "scripts/fresh-check",
    "scripts/release-check",
    "scripts/bench",
    "scripts/bench-helper",
    "scripts/fuzz",
    "scripts/tpm2-tools-join",
    "scripts/tpm2-tools-renew",
    "scripts/package",
    "scripts/vmtest",
    "scripts/vmlib.sh",
    "scripts/pxetest",
    "ramdisk/build",
    "ramdisk/append-config",
    "tpmsim-fixtures/manufacture",
    "tpmsim-fixtures/regenerate",
];

/// Every shell script passes shellcheck. Not optional: scripts/lib.sh
/// installs it, so a missing shellcheck is a broken set-up, not a skip.
#[test]
fn every_script_passes_shellcheck() {
    let ws = workspace();
    for (shell, files) in [
        ("bash", BASH_SCRIPTS),
        (
            "sh",
            &[
                "packaging/debian/postinst",
                "packaging/debian/prerm",
                "packaging/debian/postrm",
                "tests/vm/report.sh",
                "tests/vm/image/bcd-vmtest-report",
                "ramdisk/init",
                "ramdisk/udhcpc.script",
            ][..],
        ),
    ] {
        let out = Command::new("shellcheck")
            .args(["-x", "-s", shell])
            .args(files.iter().map(|f| ws.join(f)))
            .current_dir(&ws)
            .within();
        assert_ok(&out);
    }
}

/// No pipeline in the bash scripts (all run under `set -o pipefail`, or are
/// sourced by one that does) ends in a reader that stops early: `grep -q`
/// or `head` exit at the first line, the writer dies of SIGPIPE, and the
/// pipeline's status is 141. That is how `apt-cache policy … | grep -q`
/// never asked for bookworm-backports on a fresh machine (issue 16).
/// Read the whole input instead (`sed -n 1p`, `grep -c`, `[[ $(…) == *x* ]]`),
/// or let sed quit on a file it reads itself.
#[test]
fn no_pipeline_ends_in_an_early_exiting_reader() {
    let ws = workspace();
    let mut found = Vec::new();
    for file in BASH_SCRIPTS {
        let text = std::fs::read_to_string(ws.join(file)).expect("read script");
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            if let Some(reader) = early_exiting_reader(line) {
                found.push(format!("{file}:{}: `{reader}` in `{}`", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "early-exiting readers under pipefail:\n{}",
        found.join("\n")
    );
}

/// The first command after a `|` (not `||`) on the line that is one of the
/// readers that may exit before their input ends.
fn early_exiting_reader(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let mut i = 0;
    while let Some(off) = line[i..].find('|') {
        let at = i + off;
        i = at + 1;
        let double = bytes.get(at + 1) == Some(&b'|') || (at > 0 && bytes[at - 1] == b'|');
        if double {
            i = at + 2;
            continue;
        }
        let mut words = line[at + 1..].split_whitespace();
        let Some(cmd) = words.next() else { continue };
        let early = match cmd {
            "head" => true,
            "grep" | "egrep" | "fgrep" => words
                .take_while(|w| w.starts_with('-') && !w.starts_with("--"))
                .any(|w| w.contains('q') || w.contains('m')),
            _ => false,
        };
        if early {
            return Some(cmd.to_string());
        }
    }
    None
}

#[test]
fn the_reader_lint_sees_what_broke_the_fresh_machine() {
    let bug = "  apt-cache policy qemu-system-x86 | grep -q bookworm-backports && release=(-t x)";
    assert_eq!(early_exiting_reader(bug).as_deref(), Some("grep"));
    assert_eq!(
        early_exiting_reader("x=$(a | sed -n 1p | head -n1)").as_deref(),
        Some("head")
    );
    assert_eq!(
        early_exiting_reader("a | grep -Eqx y").as_deref(),
        Some("grep")
    );
    assert_eq!(early_exiting_reader("a || grep -q y; b | grep -c y"), None);
    assert_eq!(
        early_exiting_reader("head -c 32 /dev/urandom | xxd -p"),
        None
    );
}
