//! Erasing a secret from the process's initial environment.
//!
//! `/proc/<pid>/environ` is not a copy: the kernel reads it from the
//! process's own memory, the strings the environment block held at exec.
//! Unsetting a variable only drops libc's pointer to its string, so the
//! secret stays readable there for the life of the process. Overwriting the
//! bytes in place is the only way to take it out.

use std::ffi::{c_char, CStr};

extern "C" {
    /// libc's environment: a null-terminated array of `NAME=value` strings.
    static mut environ: *const *mut c_char;
}

/// Overwrites with zeros the value of every `name=…` entry of the
/// environment, in place; the entry then reads `name=` everywhere. Returns
/// how many entries were erased.
///
/// The caller guarantees that no other thread reads or changes the
/// environment meanwhile (it runs first thing in `main`).
pub(crate) fn erase_value(name: &str) -> usize {
    let prefix = [name.as_bytes(), b"="].concat();
    let mut erased = 0;
    // SAFETY: single-threaded (see above), so the array and its strings are
    // neither read nor changed concurrently. `environ` is null or a
    // null-terminated array of pointers to NUL-terminated strings, which the
    // process owns and may write: they are the exec's environment block (or
    // strings libc allocated for setenv). Only bytes before each string's
    // terminating NUL are written, so every string stays NUL-terminated.
    unsafe {
        let mut entry = std::ptr::addr_of!(environ).read();
        if entry.is_null() {
            return 0;
        }
        while !(*entry).is_null() {
            let s = *entry;
            let len = CStr::from_ptr(s).to_bytes().len();
            if len >= prefix.len()
                && std::slice::from_raw_parts(s.cast::<u8>(), prefix.len()) == prefix.as_slice()
            {
                for i in prefix.len()..len {
                    std::ptr::write_volatile(s.add(i), 0);
                }
                erased += 1;
            }
            entry = entry.add(1);
        }
    }
    erased
}
