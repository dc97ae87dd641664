//! Which TPM makers publish their EK certificates online, by
//! TPM_PT_MANUFACTURER: the control plane fetches a certificate that is not
//! in NV from the maker's service (its `attestors/tpm/ek_service.rs`, the
//! same list), so bcd can say so (`bcd doctor`, `bcd tpm identify`) and
//! ask again when such a join is refused (the service may have been
//! unreachable).

/// Intel firmware TPMs (PTT): "INTC".
pub(super) const INTEL: u32 = u32::from_be_bytes(*b"INTC");
/// AMD firmware TPMs (fTPM): "AMD" and a NUL.
pub(super) const AMD: u32 = u32::from_be_bytes(*b"AMD\0");

/// The EK service of the maker whose TPM_PT_MANUFACTURER is `manufacturer`,
/// for people; None for a maker without one (their certificates are in NV,
/// or nowhere).
pub(super) fn of(manufacturer: u32) -> Option<&'static str> {
    match manufacturer {
        INTEL => Some("Intel's EK certificate service (ekop.intel.com)"),
        AMD => Some("AMD's EK certificate service (ftpm.amd.com)"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn makers_by_their_tcg_vendor_ids() {
        // The TCG Vendor ID Registry's values (tpm2-tools spells them so too).
        assert_eq!(super::INTEL, 0x494E_5443);
        assert_eq!(super::AMD, 0x414D_4400);
        assert!(super::of(0x4942_4D00).is_none(), "IBM (swtpm) has none");
    }
}
