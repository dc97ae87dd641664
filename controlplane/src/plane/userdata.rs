//! The user data that installs bcd on a machine's first boot and joins it:
//! the `#cloud-config` `bc-controlplane user-data` prints, and the one a
//! deploy workflow's userdata.render step writes into the machine's NoCloud
//! seed ([`crate::plane::workflows`]), with the operator's own user data as
//! a second part of a MIME multipart document when there is one.

/// Where the script lands on the machine; runcmd runs it from there, and an
/// operator can run it again by hand.
pub(crate) const SCRIPT_PATH: &str = "/var/lib/bcd-install/install.sh";
/// The 0600 file the install script reads the join token from.
pub(crate) const TOKEN_PATH: &str = "/run/bcd/join-token";

/// The `#cloud-config` text: the token (if any) in a 0600 file, the script
/// as a YAML literal block (every line indented, so it reads as it will
/// run), and runcmd running it.
pub fn cloud_config(script: &str, token: Option<&str>) -> String {
    let mut out = String::from(
        "#cloud-config\n\
         # Installs bcd and joins this machine on first boot (bc-controlplane user-data).\n\
         write_files:\n",
    );
    if let Some(token) = token {
        out.push_str(&format!(
            "  - path: {TOKEN_PATH}\n    owner: root:root\n    permissions: '0600'\n    content: '{token}'\n"
        ));
    }
    out.push_str(&format!(
        "  - path: {SCRIPT_PATH}\n    owner: root:root\n    permissions: '0700'\n    content: |\n"
    ));
    for line in script.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("      ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(&format!("runcmd:\n  - [sh, {SCRIPT_PATH}]\n"));
    out
}

/// The cloud-init part type of an operator's user data, from its first
/// line, or why it cannot be merged.
pub(crate) fn part_type(user_data: &str) -> Result<&'static str, String> {
    let first = user_data.lines().next().unwrap_or("").trim_end();
    if first == "#cloud-config" {
        Ok("text/cloud-config")
    } else if first.starts_with("#!") {
        Ok("text/x-shellscript")
    } else if first == "#cloud-boothook" {
        Ok("text/cloud-boothook")
    } else {
        Err(format!(
            "the user data must start with #cloud-config, #! (a script) or #cloud-boothook to be merged with the workflow's (it starts with {:?}); a MIME multipart or #include document is not merged",
            first.chars().take(40).collect::<String>()
        ))
    }
}

/// `ours` and the operator's user data as one cloud-init MIME multipart
/// document. A second cloud-config part is merged into the first with
/// lists appended and keys of ours kept (its `Merge-Type`), so the
/// operator's write_files and runcmd run beside ours, never instead.
/// `boundary` must appear in neither (the caller draws it at random).
pub(crate) fn multipart(ours: &str, theirs: &str, boundary: &str) -> Result<String, String> {
    let kind = part_type(theirs)?;
    if ours.contains(boundary) || theirs.contains(boundary) {
        return Err("the MIME boundary occurs in the user data".to_owned());
    }
    let mut out =
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    out.push_str(&format!(
        "--{boundary}\nContent-Type: text/cloud-config; charset=\"utf-8\"\nContent-Disposition: attachment; filename=\"bcd.cfg\"\n\n{ours}"
    ));
    if !ours.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "--{boundary}\nContent-Type: {kind}; charset=\"utf-8\"\nContent-Disposition: attachment; filename=\"operator\"\n"
    ));
    if kind == "text/cloud-config" {
        out.push_str("Merge-Type: list(append)+dict(no_replace,recurse_list)+str()\n");
    }
    out.push('\n');
    out.push_str(theirs);
    if !theirs.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!("--{boundary}--\n"));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_block_keeps_the_script() {
        let text = cloud_config("#!/bin/sh\n\necho 'a: b'\n", Some("bcjt_x.y"));
        assert!(text.starts_with("#cloud-config\n"));
        assert!(text.contains("    content: 'bcjt_x.y'\n"));
        assert!(text.contains("      #!/bin/sh\n\n      echo 'a: b'\n"));
        assert!(text.ends_with("runcmd:\n  - [sh, /var/lib/bcd-install/install.sh]\n"));
    }

    #[test]
    fn the_operators_part_is_appended_or_refused() {
        let doc = multipart("#cloud-config\na: 1\n", "#cloud-config\nb: 2", "XYZ").unwrap();
        assert!(doc.starts_with("Content-Type: multipart/mixed; boundary=\"XYZ\"\n"));
        assert!(doc.contains("Merge-Type: list(append)"));
        assert!(doc.contains("\n\n#cloud-config\nb: 2\n--XYZ--\n"));
        let script = multipart("#cloud-config\n", "#!/bin/sh\necho hi\n", "XYZ").unwrap();
        assert!(script.contains("Content-Type: text/x-shellscript"));
        assert!(!script.contains("Merge-Type"));
        let e = multipart("#cloud-config\n", "hello\n", "XYZ").unwrap_err();
        assert!(e.contains("must start with #cloud-config"), "{e}");
        assert!(multipart("#cloud-config\n", "#cloud-config\nXYZ\n", "XYZ").is_err());
    }
}
