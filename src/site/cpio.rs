//! The ramdisk's configuration as a cpio archive appended to its initrd.
//!
//! One ramdisk image (`ramdisk/build`) serves every control plane: the site
//! appends `etc/bcd/config.toml` (the API URL guests use and the pins) as a
//! second archive, and the kernel unpacks every concatenated archive into the
//! same initramfs. The format is the kernel's "newc" (SVR4, no checksum):
//! a 110-byte ASCII header, the NUL-terminated name and the data, each
//! padded to 4 bytes, ended by `TRAILER!!!`. The kernel finds a field by its
//! offset from the start of the whole initrd, so the archive must start at a
//! multiple of 4 ([`padding_before`] zeros; the kernel skips them).
//!
//! Entries are owned by root with mtime 0, so the same files make the same
//! bytes (a cacheable, comparable initrd).
use std::collections::BTreeSet;

const MAGIC: &[u8] = b"070701";
const TRAILER: &str = "TRAILER!!!";
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
/// The kernel's PATH_MAX, the NUL included.
const MAX_NAME_BYTES: usize = 4096;
/// A configuration is a few KiB; this bounds what a caller can make us copy.
pub(super) const MAX_ARCHIVE_BYTES: usize = 4 * 1024 * 1024;

/// A regular file of the archive.
#[derive(Debug, Clone, Copy)]
pub(super) struct File<'a> {
    /// Relative to the ramdisk's root, `/`-separated, e.g. `etc/bcd/config.toml`.
    pub path: &'a str,
    /// Permission bits only, e.g. `0o600`.
    pub mode: u32,
    pub data: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum CpioError {
    #[error("{0:?} is not a relative path of plain names (no empty, `.` or `..` part, no NUL)")]
    Path(String),
    #[error("{path:?}: mode {mode:#o} has more than permission bits")]
    Mode { path: String, mode: u32 },
    #[error("{0:?} appears twice (or both as a file and a directory)")]
    Duplicate(String),
    #[error("the archive would exceed {MAX_ARCHIVE_BYTES} bytes")]
    TooLarge,
}

/// How many zero bytes go between an initrd of `initrd_len` bytes and an
/// archive appended to it.
pub(super) fn padding_before(initrd_len: u64) -> usize {
    // < 4, so the cast cannot truncate.
    ((4 - initrd_len % 4) % 4) as usize
}

/// The archive holding `files`, each parent directory (mode 0755) once
/// before what it contains, and the trailer.
pub(super) fn archive(files: &[File<'_>]) -> Result<Vec<u8>, CpioError> {
    let mut dirs = BTreeSet::new();
    let mut paths = BTreeSet::new();
    for f in files {
        check_path(f.path)?;
        if f.mode & !0o7777 != 0 {
            return Err(CpioError::Mode {
                path: f.path.to_owned(),
                mode: f.mode,
            });
        }
        if !paths.insert(f.path) {
            return Err(CpioError::Duplicate(f.path.to_owned()));
        }
        let mut end = 0;
        while let Some(i) = f.path[end..].find('/') {
            end += i;
            dirs.insert(&f.path[..end]);
            end += 1;
        }
    }
    if let Some(both) = dirs.iter().find(|d| paths.contains(*d)) {
        return Err(CpioError::Duplicate((*both).to_owned()));
    }
    let mut w = Writer::default();
    // BTreeSet order puts "etc" before "etc/bcd": parents first.
    for d in &dirs {
        w.entry(d, S_IFDIR | 0o755, 2, &[])?;
    }
    for f in files {
        w.entry(f.path, S_IFREG | f.mode, 1, f.data)?;
    }
    w.trailer()?;
    Ok(w.out)
}

fn check_path(path: &str) -> Result<(), CpioError> {
    let ok = !path.is_empty()
        && path.len() < MAX_NAME_BYTES
        && !path.contains('\0')
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..");
    if ok {
        Ok(())
    } else {
        Err(CpioError::Path(path.to_owned()))
    }
}

#[derive(Default)]
struct Writer {
    out: Vec<u8>,
    /// The last inode number given; each entry gets its own (the trailer 0).
    ino: u32,
}

impl Writer {
    fn entry(&mut self, name: &str, mode: u32, nlink: u32, data: &[u8]) -> Result<(), CpioError> {
        self.ino += 1;
        self.write(self.ino, name, mode, nlink, data)
    }

    fn trailer(&mut self) -> Result<(), CpioError> {
        self.write(0, TRAILER, 0, 1, &[])
    }

    fn write(
        &mut self,
        ino: u32,
        name: &str,
        mode: u32,
        nlink: u32,
        data: &[u8],
    ) -> Result<(), CpioError> {
        // Header, name, data and both paddings: checked before any copy.
        let grown = self.out.len() + 110 + name.len() + 4 + data.len() + 4;
        if grown > MAX_ARCHIVE_BYTES {
            return Err(CpioError::TooLarge);
        }
        // Both fit: the archive's cap is far below u32::MAX.
        let size = u32::try_from(data.len()).map_err(|_| CpioError::TooLarge)?;
        let namesize = u32::try_from(name.len() + 1).map_err(|_| CpioError::TooLarge)?;
        self.out.extend_from_slice(MAGIC);
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
        for field in [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, namesize, 0] {
            self.out
                .extend_from_slice(format!("{field:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    fn pad(&mut self) {
        while self.out.len() % 4 != 0 {
            self.out.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One parsed entry: (name, mode, nlink, ino, data).
    type Parsed = (String, u32, u32, u32, Vec<u8>);

    /// A reader as strict as the kernel's: every header at a multiple of 4.
    fn parse(mut buf: &[u8]) -> Vec<Parsed> {
        let total = buf.len();
        let mut out = Vec::new();
        loop {
            assert_eq!((total - buf.len()) % 4, 0, "header not 4-byte aligned");
            assert_eq!(&buf[..6], MAGIC);
            let field = |i: usize| {
                let s = std::str::from_utf8(&buf[6 + 8 * i..14 + 8 * i]).unwrap();
                u32::from_str_radix(s, 16).unwrap()
            };
            let (ino, mode, nlink, size, namesize) = (
                field(0),
                field(1),
                field(4),
                field(6) as usize,
                field(11) as usize,
            );
            assert_eq!((field(2), field(3), field(5), field(12)), (0, 0, 0, 0));
            let name = std::str::from_utf8(&buf[110..110 + namesize - 1])
                .unwrap()
                .to_owned();
            assert_eq!(buf[110 + namesize - 1], 0, "name not NUL-terminated");
            let data_at = (110 + namesize).next_multiple_of(4);
            let data = buf[data_at..data_at + size].to_vec();
            buf = &buf[(data_at + size).next_multiple_of(4)..];
            if name == TRAILER {
                assert_eq!((ino, mode, size), (0, 0, 0));
                assert!(buf.is_empty(), "bytes after the trailer");
                return out;
            }
            out.push((name, mode, nlink, ino, data));
        }
    }

    #[test]
    fn a_file_and_its_parents_then_the_trailer() {
        let config = b"api = \"https://10.0.2.100:8443\"\n";
        let bytes = archive(&[File {
            path: "etc/bcd/config.toml",
            mode: 0o600,
            data: config,
        }])
        .unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let entries = parse(&bytes);
        let summary: Vec<_> = entries
            .iter()
            .map(|(n, m, l, i, _)| (n.as_str(), *m, *l, *i))
            .collect();
        assert_eq!(
            summary,
            [
                ("etc", 0o040755, 2, 1),
                ("etc/bcd", 0o040755, 2, 2),
                ("etc/bcd/config.toml", 0o100600, 1, 3),
            ]
        );
        assert_eq!(entries[2].4, config);
    }

    #[test]
    fn the_header_is_newc_byte_for_byte() {
        let bytes = archive(&[File {
            path: "a",
            mode: 0o644,
            data: b"xyz",
        }])
        .unwrap();
        let header = concat!(
            "070701", "00000001", "000081A4", "00000000", "00000000", "00000001", "00000000",
            "00000003", "00000000", "00000000", "00000000", "00000000", "00000002", "00000000"
        );
        assert_eq!(&bytes[..110], header.as_bytes());
        // name "a\0" ends at 112 (aligned), data "xyz" padded to 116.
        assert_eq!(&bytes[110..116], b"a\0xyz\0");
        assert_eq!(&bytes[116..122], b"070701");
        assert!(bytes.windows(11).any(|w| w == b"TRAILER!!!\0"));
    }

    #[test]
    fn shared_parents_once_and_many_files() {
        let bytes = archive(&[
            File {
                path: "etc/bcd/config.toml",
                mode: 0o600,
                data: b"1",
            },
            File {
                path: "etc/hosts",
                mode: 0o644,
                data: b"22",
            },
            File {
                path: "etc/bcd/ca.pem",
                mode: 0o644,
                data: b"",
            },
        ])
        .unwrap();
        let names: Vec<_> = parse(&bytes).into_iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "etc",
                "etc/bcd",
                "etc/bcd/config.toml",
                "etc/hosts",
                "etc/bcd/ca.pem"
            ]
        );
    }

    /// A real reader: busybox's cpio unpacks it (the kernel's own reading
    /// is proven by scripts/pxetest once `bcd site` serves the archive).
    #[test]
    fn busybox_cpio_unpacks_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let bytes = archive(&[
            File {
                path: "etc/bcd/config.toml",
                mode: 0o600,
                data: b"api = 1\n",
            },
            File {
                path: "etc/hosts",
                mode: 0o644,
                data: b"10.0.2.100 localhost\n",
            },
        ])
        .unwrap();
        let run = std::process::Command::new("busybox")
            .args(["cpio", "-i", "-d"])
            .current_dir(tmp.path())
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = run else {
            eprintln!("skipped: no busybox (scripts/pxetest installs busybox-static)");
            return;
        };
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &bytes).unwrap();
        let done = child.wait_with_output().unwrap();
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        let config = tmp.path().join("etc/bcd/config.toml");
        assert_eq!(std::fs::read(&config).unwrap(), b"api = 1\n");
        let mode = std::fs::metadata(&config).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o600);
        assert_eq!(
            std::fs::read(tmp.path().join("etc/hosts")).unwrap(),
            b"10.0.2.100 localhost\n"
        );
    }

    #[test]
    fn padding_aligns_the_appended_archive() {
        assert_eq!(
            (0..8).map(padding_before).collect::<Vec<_>>(),
            [0, 3, 2, 1, 0, 3, 2, 1]
        );
    }

    #[test]
    fn refuses_bad_paths_modes_duplicates_and_size() {
        for bad in ["", "/etc/x", "etc//x", "etc/../x", "./x", "x/", "a\0b"] {
            let f = File {
                path: bad,
                mode: 0o600,
                data: b"",
            };
            assert_eq!(
                archive(&[f]),
                Err(CpioError::Path(bad.to_owned())),
                "{bad:?}"
            );
        }
        let setuid_dir = File {
            path: "x",
            mode: 0o040600,
            data: b"",
        };
        assert!(matches!(
            archive(&[setuid_dir]),
            Err(CpioError::Mode { .. })
        ));
        let f = File {
            path: "x",
            mode: 0o600,
            data: b"",
        };
        assert_eq!(archive(&[f, f]), Err(CpioError::Duplicate("x".into())));
        let dir_and_file = [
            f,
            File {
                path: "x/y",
                mode: 0o600,
                data: b"",
            },
        ];
        assert_eq!(
            archive(&dir_and_file),
            Err(CpioError::Duplicate("x".into()))
        );
        let big = vec![0u8; MAX_ARCHIVE_BYTES];
        let f = File {
            path: "big",
            mode: 0o600,
            data: &big,
        };
        assert_eq!(archive(&[f]), Err(CpioError::TooLarge));
    }
}
