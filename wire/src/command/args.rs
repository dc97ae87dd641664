//! Command arguments: their shapes and the checks both sides run.
//!
//! Arguments travel as `name = value` strings, sorted by name, each name
//! once: one command has one encoding, and a value is read the same way on
//! both sides. Each kind lists its arguments ([`ArgSpec`]); the control
//! plane checks them before it queues a command and the agent again before
//! it runs one, so a value that reaches a kind's code already has its shape
//! (a device is a `/dev` name, a bound is a number within its range).

use crate::command_v1::Arg;

/// The most arguments a command carries.
pub const MAX_ARGS: usize = 16;
/// The longest argument value (bytes).
pub const MAX_ARG_VALUE: usize = 1024;
/// The most devices one `devices` list names.
pub const MAX_DEVICES: usize = 16;

/// What a value must look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// One block device: `/dev/` then a kernel name (a lowercase letter,
    /// then lowercase letters, digits, `-` or `_`; at most 32), never a
    /// path elsewhere.
    Device,
    /// One or more [`Check::Device`] names, comma-separated, none twice.
    Devices,
    /// A lowercase hex SHA-256 (64 characters).
    Digest,
    /// A registered name (an image): 1–64 of `[a-z0-9._-]`, not starting
    /// with `.`.
    Name,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Printable ASCII, at most this many bytes.
    Text(usize),
    /// Unix milliseconds (a non-negative decimal).
    UnixMs,
    /// A decimal within these bounds, inclusive.
    Within(u64, u64),
}

/// One argument of a kind.
#[derive(Debug, PartialEq, Eq)]
pub struct ArgSpec {
    pub name: &'static str,
    pub required: bool,
    pub check: Check,
}

impl ArgSpec {
    pub(crate) const fn required(name: &'static str, check: Check) -> Self {
        ArgSpec {
            name,
            required: true,
            check,
        }
    }

    pub(crate) const fn optional(name: &'static str, check: Check) -> Self {
        ArgSpec {
            name,
            required: false,
            check,
        }
    }
}

/// Why a command's arguments are refused (`bad-args`).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgError {
    #[error("{0} arguments, at most {MAX_ARGS}")]
    TooMany(usize),
    #[error("the arguments are not sorted by name, each name once (at {0:?})")]
    NotSorted(String),
    #[error("unknown argument {0:?}")]
    Unknown(String),
    #[error("missing argument {0:?}")]
    Missing(&'static str),
    #[error("argument {0:?} is longer than {MAX_ARG_VALUE} bytes")]
    TooLong(&'static str),
    #[error("argument {name:?}: {why}")]
    Invalid { name: &'static str, why: String },
}

/// Arguments that passed their kind's checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args(Vec<(String, String)>);

impl Args {
    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A numeric argument (`Within`, `UnixMs`), already checked to parse.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|v| v.parse().ok())
    }

    /// A `Devices` argument as its list of `/dev` names.
    pub fn devices(&self, name: &str) -> Vec<&str> {
        self.get(name)
            .map(|v| v.split(',').collect())
            .unwrap_or_default()
    }

    /// The `(name, value)` pairs, sorted by name.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

/// Checks `args` against a kind's `specs`.
pub fn check(specs: &'static [ArgSpec], args: &[Arg]) -> Result<Args, ArgError> {
    if args.len() > MAX_ARGS {
        return Err(ArgError::TooMany(args.len()));
    }
    for w in args.windows(2) {
        if w[0].name >= w[1].name {
            return Err(ArgError::NotSorted(printable(&w[1].name)));
        }
    }
    for a in args {
        let spec = specs
            .iter()
            .find(|s| s.name == a.name)
            .ok_or_else(|| ArgError::Unknown(printable(&a.name)))?;
        if a.value.len() > MAX_ARG_VALUE {
            return Err(ArgError::TooLong(spec.name));
        }
        check_value(spec.check, &a.value).map_err(|why| ArgError::Invalid {
            name: spec.name,
            why,
        })?;
    }
    if let Some(missing) = specs
        .iter()
        .find(|s| s.required && !args.iter().any(|a| a.name == s.name))
    {
        return Err(ArgError::Missing(missing.name));
    }
    Ok(Args(
        args.iter()
            .map(|a| (a.name.clone(), a.value.clone()))
            .collect(),
    ))
}

fn check_value(check: Check, v: &str) -> Result<(), String> {
    match check {
        Check::Device => device(v),
        Check::Devices => {
            let list: Vec<&str> = v.split(',').collect();
            if list.len() > MAX_DEVICES {
                return Err(format!("{} devices, at most {MAX_DEVICES}", list.len()));
            }
            for (i, d) in list.iter().enumerate() {
                device(d)?;
                if list[..i].contains(d) {
                    return Err(format!("{d} is named twice"));
                }
            }
            Ok(())
        }
        Check::Digest => {
            let ok = v.len() == 64
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            ok.then_some(())
                .ok_or_else(|| "not a lowercase hex SHA-256".to_owned())
        }
        Check::Name => {
            let ok = !v.is_empty()
                && v.len() <= 64
                && !v.starts_with('.')
                && v.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                });
            ok.then_some(())
                .ok_or_else(|| "not a name (1-64 of a-z 0-9 . _ -)".to_owned())
        }
        Check::OneOf(words) => words
            .contains(&v)
            .then_some(())
            .ok_or_else(|| format!("not one of {}", words.join(", "))),
        Check::Text(max) => {
            let ok = v.len() <= max && v.bytes().all(|b| (0x20..0x7f).contains(&b));
            ok.then_some(())
                .ok_or_else(|| format!("not printable ASCII of at most {max} bytes"))
        }
        Check::UnixMs => decimal(v).map(drop),
        Check::Within(lo, hi) => {
            let n = decimal(v)?;
            (lo..=hi)
                .contains(&n)
                .then_some(())
                .ok_or_else(|| format!("{n} is not within {lo}..={hi}"))
        }
    }
}

/// `/dev/<kernel name>`: nothing that walks elsewhere (`..`, a further
/// `/`), nothing a shell or a log would read differently.
fn device(v: &str) -> Result<(), String> {
    let name = v.strip_prefix("/dev/").unwrap_or_default();
    let mut bytes = name.bytes();
    let ok = name.len() <= 32
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_'));
    ok.then_some(())
        .ok_or_else(|| format!("{:?} is not a /dev/<name> device", printable(v)))
}

/// A plain decimal: digits only (no sign, no spaces), at most 19 of them.
fn decimal(v: &str) -> Result<u64, String> {
    let ok = !v.is_empty() && v.len() <= 19 && v.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| v.parse().ok())
        .flatten()
        .ok_or_else(|| format!("{:?} is not a decimal number", printable(v)))
}

/// A bounded, printable rendering of an untrusted string for a message.
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::kinds::lookup;

    fn args(pairs: &[(&str, &str)]) -> Vec<Arg> {
        pairs
            .iter()
            .map(|(n, v)| Arg {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect()
    }

    fn wipe(pairs: &[(&str, &str)]) -> Result<Args, ArgError> {
        check(lookup("disk.wipe").unwrap().args, &args(pairs))
    }

    fn logs(pairs: &[(&str, &str)]) -> Result<Args, ArgError> {
        check(lookup("logs.collect").unwrap().args, &args(pairs))
    }

    #[test]
    fn disk_wipe_takes_only_dev_names() {
        let ok = wipe(&[("devices", "/dev/sda,/dev/nvme0n1")]).unwrap();
        assert_eq!(ok.devices("devices"), ["/dev/sda", "/dev/nvme0n1"]);
        assert_eq!(wipe(&[]), Err(ArgError::Missing("devices")));
        for bad in [
            "",
            "sda",
            "/dev/",
            "/dev/../etc/passwd",
            "/dev/disk/by-id/x",
            "/dev/SDA",
            "/dev/0sda",
            "/dev/sda,",
            "/dev/sda /dev/sdb",
            "/dev/sda,/dev/sda",
            "/tmp/sda",
        ] {
            assert!(
                matches!(
                    wipe(&[("devices", bad)]),
                    Err(ArgError::Invalid {
                        name: "devices",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        let many = (0..17).map(|i| format!("/dev/sd{i}")).collect::<Vec<_>>();
        assert!(wipe(&[("devices", &many.join(","))]).is_err());
    }

    #[test]
    fn logs_collect_is_bounded() {
        let ok = logs(&[
            ("bytes", "4096"),
            ("lines", "100"),
            ("since", "1790000000000"),
        ])
        .unwrap();
        assert_eq!(ok.number("lines"), Some(100));
        assert_eq!(ok.number("bytes"), Some(4096));
        assert!(logs(&[]).is_ok(), "every bound has a default");
        for (n, v) in [
            ("lines", "0"),
            ("lines", "100001"),
            ("bytes", "1048577"),
            ("lines", "-1"),
            ("lines", "+5"),
            ("lines", " 5"),
            ("since", "99999999999999999999"),
            ("since", "yesterday"),
        ] {
            assert!(
                matches!(logs(&[(n, v)]), Err(ArgError::Invalid { .. })),
                "{n}={v}"
            );
        }
    }

    #[test]
    fn names_are_known_sorted_once_and_values_bounded() {
        assert_eq!(
            logs(&[("lines", "1"), ("bytes", "1")]),
            Err(ArgError::NotSorted("bytes".into()))
        );
        assert_eq!(
            logs(&[("lines", "1"), ("lines", "2")]),
            Err(ArgError::NotSorted("lines".into()))
        );
        assert_eq!(
            logs(&[("follow", "1")]),
            Err(ArgError::Unknown("follow".into()))
        );
        let long = "1".repeat(MAX_ARG_VALUE + 1);
        assert_eq!(logs(&[("since", &long)]), Err(ArgError::TooLong("since")));
        let many: Vec<(String, String)> = (0..17)
            .map(|i| (format!("a{i:02}"), String::new()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(logs(&many), Err(ArgError::TooMany(17)));
    }

    #[test]
    fn deploy_and_kexec_shapes() {
        let deploy = lookup("deploy.image").unwrap().args;
        let digest = "ab".repeat(32);
        let ok = check(
            deploy,
            &args(&[
                ("bytes", "1048576"),
                ("compression", "zstd"),
                ("disk", "/dev/vda"),
                ("image", "debian-12.raw"),
                ("seed", &digest),
                ("sha256", &digest),
            ]),
        );
        assert_eq!(ok.map(|a| a.number("bytes")), Ok(Some(1 << 20)));
        assert_eq!(
            check(
                deploy,
                &args(&[
                    ("disk", "/dev/vda"),
                    ("image", "debian"),
                    ("sha256", &digest)
                ])
            ),
            Err(ArgError::Missing("bytes"))
        );
        assert!(check(
            deploy,
            &args(&[
                ("bytes", "0"),
                ("disk", "/dev/vda"),
                ("image", "debian"),
                ("sha256", &digest)
            ])
        )
        .is_err());
        let upper = "AB".repeat(32);
        assert!(check(
            deploy,
            &args(&[
                ("bytes", "1"),
                ("disk", "/dev/vda"),
                ("image", "debian"),
                ("sha256", &upper)
            ])
        )
        .is_err());
        assert!(check(
            deploy,
            &args(&[
                ("bytes", "1"),
                ("disk", "/dev/vda"),
                ("image", "../x"),
                ("sha256", &digest)
            ])
        )
        .is_err());
        let kexec = lookup("boot.kexec").unwrap().args;
        assert!(check(kexec, &args(&[("disk", "/dev/vda"), ("mode", "reboot")])).is_ok());
        assert!(check(kexec, &args(&[("disk", "/dev/vda"), ("mode", "halt")])).is_err());
        assert!(check(
            kexec,
            &args(&[
                ("cmdline", "root=UUID=x console=ttyS0"),
                ("disk", "/dev/vda")
            ])
        )
        .is_ok());
        assert!(check(kexec, &args(&[("cmdline", "a\nb"), ("disk", "/dev/vda")])).is_err());
        let ping = lookup("diag.ping").unwrap().args;
        assert!(check(ping, &args(&[("echo", "hello")])).is_ok());
        assert!(check(ping, &args(&[("echo", "a\nb")])).is_err());
    }
}
