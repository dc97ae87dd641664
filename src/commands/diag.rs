//! `diag.ping` (the channel answers) and `diag.doctor` (bcd doctor's
//! checks, as its `--json` prints them).
use std::path::Path;

use super::Done;

/// `{"pong": true, "echo": …, "version": …, "agentTimeMs": …}`.
pub(super) fn ping(echo: Option<&str>) -> Done {
    let body = serde_json::json!({
        "pong": true,
        "echo": echo,
        "version": env!("CARGO_PKG_VERSION"),
        "agentTimeMs": crate::clock::unix_ms(crate::clock::now()),
    });
    Done::ok("pong", body.to_string().as_bytes())
}

/// `bcd doctor --json` of the config this node runs with. The command
/// succeeds when the checks ran; what they found is in the output and the
/// outcome (`doctor: ok`, `doctor: 2 failed`).
pub(super) fn doctor(config_path: &Path) -> Done {
    let report = crate::doctor::diagnose(config_path);
    let failed = report
        .checks
        .iter()
        .filter(|c| c.status == crate::doctor::Status::Fail)
        .count();
    match serde_json::to_vec(&report) {
        Ok(json) if failed == 0 => Done::ok("doctor: ok", &json),
        Ok(json) => Done::ok(format!("doctor: {failed} failed"), &json),
        Err(e) => Done::failed(format!("cannot encode the doctor's report: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_wire::command_v1::Status;

    #[test]
    fn ping_echoes_and_doctor_reports_json() {
        let d = ping(Some("hello"));
        assert_eq!((d.status, d.outcome.as_str()), (Status::Ok, "pong"));
        let dir = tempfile::tempdir().unwrap();
        let d = doctor(&dir.path().join("missing.toml"));
        assert_eq!(d.status, Status::Ok);
        assert_eq!(d.outcome, "doctor: 1 failed", "the config check fails");
    }
}
