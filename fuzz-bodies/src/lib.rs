//! The bodies of the fuzz targets: one `pub fn(&[u8])` per target, each
//! feeding its input to the real parser (never a copy of it) and asserting
//! what must hold for any input. `fuzz/fuzz_targets/<name>.rs` calls the
//! body under libFuzzer (nightly, `scripts/fuzz`); the corpus test below
//! replays every file of `fuzz/corpus/<name>/` through the same body on
//! stable, inside `cargo test --workspace`, so a crash the fuzzer once found
//! stays fixed without building libFuzzer in CI.
//!
//! A body must not panic on any input: a panic is a finding (the project's
//! rule is no panic on network, disk or command-line input).

mod agent;
mod cloud;
mod command;
mod controlplane;
mod deploy;
mod eventlog;
mod fixtures;
mod helper;
mod site;
mod wire;

pub use agent::{bcd_config, identity_json, join_answer, renew_answer};
pub use cloud::{aws_document, azure_document, gcp_token};
pub use command::{channel_agent_frame, channel_server_frame};
pub use controlplane::{boot_policy, cloud_cms, cp_config, ek_cert, join_request, renew_request};
pub use deploy::{deploy_image, deploy_seed};
pub use eventlog::eventlog;
pub use helper::helper_frames;
pub use site::{ramdisk_cmdline, site_request};
pub use wire::{join_token, sealed_token, tpm_wire, x509pop_evidence};

/// A target's body.
#[cfg(test)]
type Body = fn(&[u8]);

/// Every target: its name (the directory of its corpus, the file of its
/// fuzz target) and its body. The corpus test's (tests.rs).
#[cfg(test)]
const TARGETS: &[(&str, Body)] = &[
    ("join_request", join_request),
    ("join_answer", join_answer),
    ("renew_request", renew_request),
    ("renew_answer", renew_answer),
    ("tpm_wire", tpm_wire),
    ("x509pop_evidence", x509pop_evidence),
    ("join_token", join_token),
    ("sealed_token", sealed_token),
    ("identity_json", identity_json),
    ("bcd_config", bcd_config),
    ("cp_config", cp_config),
    ("ek_cert", ek_cert),
    ("cloud_cms", cloud_cms),
    ("site_request", site_request),
    ("ramdisk_cmdline", ramdisk_cmdline),
    ("gcp_token", gcp_token),
    ("aws_document", aws_document),
    ("azure_document", azure_document),
    ("helper_frames", helper_frames),
    ("channel_server_frame", channel_server_frame),
    ("channel_agent_frame", channel_agent_frame),
    ("eventlog", eventlog),
    ("deploy_seed", deploy_seed),
    ("deploy_image", deploy_image),
    ("boot_policy", boot_policy),
];

/// Splits an input into `N` parts: every part but the last is prefixed by
/// its length (u16, big-endian); a short input leaves the rest empty.
/// [`join_parts`] is the inverse, for seeds.
pub(crate) fn split_parts<const N: usize>(mut data: &[u8]) -> [&[u8]; N] {
    let mut out = [&[][..]; N];
    for (i, slot) in out.iter_mut().enumerate() {
        if i + 1 == N {
            *slot = data;
            break;
        }
        let Some((len, rest)) = data.split_first_chunk::<2>() else {
            break;
        };
        let n = usize::from(u16::from_be_bytes(*len)).min(rest.len());
        let (part, rest) = rest.split_at(n);
        *slot = part;
        data = rest;
    }
    out
}

/// The input [`split_parts`] splits into `parts`, for the seeds (tests.rs).
#[cfg(test)]
fn join_parts(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if i + 1 < parts.len() {
            let n = u16::try_from(p.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&n.to_be_bytes());
            out.extend_from_slice(&p[..usize::from(n)]);
        } else {
            out.extend_from_slice(p);
        }
    }
    out
}

#[cfg(test)]
mod tests;
