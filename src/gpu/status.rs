//! The status words kernels write when a page is malformed.
//!
//! Kernels keep the first problem a page (or chunk) has in a `u32` status
//! word, with the codes of `GpqStatus` in `kernels/common.cuh`. Those codes
//! are the kernel kinds of [`CorruptKind`], number for number; a test below
//! reads the `.cuh` source and fails if the two drift apart.

use crate::error::{CorruptKind, Error, Result};

/// The kind a non-zero kernel status word names; an unknown code is a gpq bug.
pub(crate) fn corrupt_kind(code: u32) -> Result<CorruptKind> {
    CorruptKind::from_code(code)
        .filter(|k| k.is_kernel_status())
        .ok_or_else(|| Error::Internal(format!("a kernel reported the unknown status {code}")))
}

/// The `NAME = value` entries of `enum <name> : u32 { ... }` in CUDA source
/// text, in order. Used by tests that keep Rust's copies of kernel enums in
/// step with the `.cuh` files.
#[cfg(test)]
pub(crate) fn cuh_enum(source: &str, name: &str) -> Vec<(String, u32)> {
    let start = source.find(&format!("enum {name} : u32 {{")).unwrap_or_else(|| panic!("no enum {name}"));
    let body = &source[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
    body.lines()
        .map(|l| l.split("//").next().unwrap().trim().trim_end_matches(','))
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once('=').unwrap_or_else(|| panic!("enum {name}: entry without a value: {l}"));
            (n.trim().to_string(), v.trim().parse().unwrap_or_else(|_| panic!("enum {name}: bad value in {l}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPQ_ERR_TRUNCATED_HEADER <-> TruncatedHeader, and so on.
    fn rust_name(cuh: &str) -> String {
        cuh.trim_start_matches("GPQ_ERR_")
            .split('_')
            .map(|w| {
                let w = w.to_ascii_lowercase();
                let mut c = w.chars();
                c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn kernel_status_codes_match_the_cuda_source() {
        let entries = cuh_enum(include_str!("kernels/common.cuh"), "GpqStatus");
        assert_eq!(entries[0], ("GPQ_OK".to_string(), 0));
        let kernel_kinds: Vec<CorruptKind> = CorruptKind::ALL.into_iter().filter(|k| k.is_kernel_status()).collect();
        assert_eq!(entries.len() - 1, kernel_kinds.len(), "GpqStatus and CorruptKind list different numbers of kernel codes");
        for ((name, code), kind) in entries[1..].iter().zip(&kernel_kinds) {
            assert_eq!(*code, kind.code(), "{name}");
            assert_eq!(rust_name(name), format!("{kind:?}"), "code {code}");
            assert_eq!(corrupt_kind(*code).unwrap(), *kind);
        }
        assert!(corrupt_kind(0).is_err());
        assert!(corrupt_kind(CorruptKind::Decompression.code()).is_err(), "host kinds are not kernel statuses");
    }
}
