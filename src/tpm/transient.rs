//! Transient objects left in the TPM by a process that died without
//! flushing them. Behind the kernel's resource manager (`/dev/tpmrm0`)
//! there are none to see: each connection has its own. On a TPM reached
//! directly (swtpm's socket, `/dev/tpm0`) a killed `bcd helper` leaves its
//! cached keys in the TPM's three object slots, and its successor, the
//! TPM's only user, flushes them before it starts.
use tss_esapi::constants::CapabilityType;
use tss_esapi::structures::CapabilityData;

use super::{cmd, Tpm, TpmError};

/// TPM_HT_TRANSIENT's first handle.
const TRANSIENT_FIRST: u32 = 0x8000_0000;

impl Tpm {
    /// Flushes every transient object this connection can see; called
    /// right after opening, before it loads any. The number flushed.
    pub(crate) fn flush_stale_transients(&mut self) -> Result<usize, TpmError> {
        let (data, _) = cmd(
            "GetCapability",
            self.ctx
                .get_capability(CapabilityType::Handles, TRANSIENT_FIRST, 16),
        )?;
        let CapabilityData::Handles(handles) = data else {
            return Err(TpmError::Unexpected("a capability of another kind"));
        };
        let mut flushed = 0;
        for handle in handles.into_inner() {
            let object = cmd("TR_FromTPMPublic", self.ctx.tr_from_tpm_public(handle))?;
            cmd("FlushContext", self.ctx.flush_context(object))?;
            flushed += 1;
        }
        Ok(flushed)
    }
}
