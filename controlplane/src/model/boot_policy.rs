//! TEMPORARY STUB (helper G): replaced by branch bpol's module at merge.
use crate::store::{DbError, Tx};
#[derive(Debug)]
pub(crate) struct BootPolicy;
#[derive(Debug, Clone, Copy)]
pub(crate) struct BootReason;
impl From<BootReason> for crate::reason::AnyReason {
    fn from(_: BootReason) -> Self {
        crate::reason::AnyReason::of("tpm", "boot-app")
    }
}
#[derive(Debug)]
pub(crate) struct BootRefusal {
    pub reason: BootReason,
    pub detail: String,
    pub event: Option<usize>,
}
impl std::fmt::Display for BootRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}
pub(crate) fn needed_pcrs(_: &BootPolicy) -> Vec<u32> {
    vec![0, 7]
}
pub(crate) fn always_extended(p: &[u32]) -> Vec<u32> {
    p.to_vec()
}
pub(crate) fn pool_boot_policy(_: &Tx<'_>, _: &str) -> Result<Option<BootPolicy>, DbError> {
    Ok(None)
}
pub(crate) fn judge(_: &BootPolicy, _: &bc_eventlog::BootFacts) -> Result<(), BootRefusal> {
    Err(BootRefusal {
        reason: BootReason,
        detail: String::new(),
        event: None,
    })
}
