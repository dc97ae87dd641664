//! Named crash points for the end-to-end tests of crash safety (kill -9 at
//! each step of a renewal). Compiled in only with the `failpoints` feature,
//! which `scripts/test` enables; in any other build `hit` is empty.

/// Aborts the process (as a kill -9 would end it: no destructors, no
/// flushing) when `BCD_FAILPOINT` names this point.
#[inline]
pub(crate) fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("BCD_FAILPOINT").is_ok_and(|v| v == name) {
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// Whether `BCD_FAILPOINT` names this point, for the points that make bcd
/// do something (rather than crash) in a test.
#[inline]
pub(crate) fn active(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    return std::env::var("BCD_FAILPOINT").is_ok_and(|v| v == name);
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}
