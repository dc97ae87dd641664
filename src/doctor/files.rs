//! The data directory: there, owned by the running user, 0700; the identity
//! files in it 0600.
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use super::{Check, DATA_DIR};
use crate::identity::{IDENTITY_FILE, JOURNAL_FILE, NODE_KEY_FILE, NODE_KEY_NEXT_FILE};

/// The files that must be 0600.
const PRIVATE_FILES: [&str; 4] = [
    IDENTITY_FILE,
    NODE_KEY_FILE,
    NODE_KEY_NEXT_FILE,
    JOURNAL_FILE,
];

pub(super) use crate::identity::guard::effective_uid;

pub(super) fn check_data_dir(dir: &Path, euid: Option<u32>) -> Check {
    let shown = dir.display();
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Check::fail(
                DATA_DIR,
                format!("{shown} does not exist"),
                "bcd join creates it: run bcd join",
            )
        }
        Err(e) => {
            return Check::fail(
                DATA_DIR,
                format!("cannot read {shown}: {e}"),
                "run bcd doctor as the user that runs bcd node (or as root)",
            )
        }
    };
    if !meta.is_dir() {
        return Check::fail(
            DATA_DIR,
            format!("{shown} is not a directory"),
            "move it away; bcd join creates the directory",
        );
    }

    let mut problems = Vec::new();
    let mut chmods = Vec::new();
    let mut foreign = false;
    // What bcd refuses to use (see `identity::guard`), not only a loose mode.
    let mut refused = Vec::new();
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        refused.push(format!(
            "the directory is writable by group or others ({mode:04o})"
        ));
    }
    if mode & 0o077 != 0 {
        problems.push(format!("the directory is {mode:04o}, expected 0700"));
        chmods.push(format!("chmod 700 {shown}"));
    }
    if let Some(uid) = euid {
        if meta.uid() != uid {
            problems.push(format!(
                "owned by uid {}, not by the running user (uid {uid})",
                meta.uid()
            ));
            foreign = true;
        }
    }
    let mut present = 0;
    let mut loose = Vec::new();
    for name in PRIVATE_FILES {
        let path = dir.join(name);
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if m.file_type().is_symlink() {
            refused.push(format!(
                "{name} is a symbolic link (bcd follows none; remove it)"
            ));
            continue;
        }
        present += 1;
        if m.mode() & 0o022 != 0 {
            refused.push(format!("{name} is writable by group or others"));
        }
        let fmode = m.mode() & 0o777;
        if fmode & 0o077 != 0 {
            problems.push(format!("{name} is {fmode:04o}, expected 0600"));
            loose.push(path.display().to_string());
        }
        if euid.is_some_and(|uid| m.uid() != uid) && !foreign {
            problems.push(format!("{name} is owned by uid {}", m.uid()));
            foreign = true;
        }
    }
    if !loose.is_empty() {
        chmods.push(format!("chmod 600 {}", loose.join(" ")));
    }

    if !refused.is_empty() {
        let mut hints = vec!["bcd refuses these files".to_owned()];
        hints.extend(chmods);
        return Check::fail(
            DATA_DIR,
            format!("{shown}: {}", [refused, problems].concat().join(", ")),
            hints.join("; "),
        );
    }
    if problems.is_empty() {
        let files = if present == 0 {
            "no identity files yet".to_owned()
        } else {
            "identity files 0600".to_owned()
        };
        let owner = match euid {
            Some(uid) => format!(", owned by uid {uid}"),
            None => String::new(),
        };
        return Check::ok(DATA_DIR, format!("{shown}: 0700{owner}, {files}"));
    }
    let mut hints = chmods;
    if foreign {
        hints.push(
            "run bcd doctor as the user that runs bcd node, or give it the directory (chown -R)"
                .to_owned(),
        );
    }
    Check::warn(
        DATA_DIR,
        format!("{shown}: {}", problems.join(", ")),
        hints.join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn modes_and_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let euid = effective_uid();
        let c = check_data_dir(&dir, euid);
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.ends_with("does not exist"), "{}", c.message);

        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        std::fs::write(dir.join(IDENTITY_FILE), "{}").unwrap();
        chmod(&dir.join(IDENTITY_FILE), 0o600);
        let c = check_data_dir(&dir, euid);
        assert_eq!(c.status, Status::Ok, "{}", c.line());
        assert!(c.message.ends_with("identity files 0600"), "{}", c.message);

        chmod(&dir, 0o755);
        chmod(&dir.join(IDENTITY_FILE), 0o644);
        let c = check_data_dir(&dir, euid);
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("the directory is 0755, expected 0700"));
        assert!(c.message.contains("identity.json is 0644, expected 0600"));
        assert_eq!(
            c.hint.as_deref(),
            Some(
                format!(
                    "chmod 700 {}; chmod 600 {}",
                    dir.display(),
                    dir.join(IDENTITY_FILE).display()
                )
                .as_str()
            )
        );

        chmod(&dir, 0o770);
        let c = check_data_dir(&dir, euid);
        assert_eq!(c.status, Status::Fail, "{}", c.line());
        chmod(&dir, 0o700);
        chmod(&dir.join(IDENTITY_FILE), 0o600);
        std::os::unix::fs::symlink("/etc/passwd", dir.join(JOURNAL_FILE)).unwrap();
        let c = check_data_dir(&dir, euid);
        assert_eq!(c.status, Status::Fail, "{}", c.line());
        assert!(
            c.message.contains("journal.db is a symbolic link"),
            "{}",
            c.message
        );
        std::fs::remove_file(dir.join(JOURNAL_FILE)).unwrap();
        let other = euid.map(|u| u.wrapping_add(1));
        let c = check_data_dir(&dir, other);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.message.contains("not by the running user"),
            "{}",
            c.message
        );
    }
}
