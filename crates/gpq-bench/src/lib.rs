//! gpq's benchmarks, outside the core crates as DataFusion keeps its own:
//! TPC-H data generated with `tpchgen` and written as Parquet ([`tpch`]),
//! the 22 TPC-H queries ([`tpch::queries`]; running them needs the
//! `datafusion` feature), what gpq is compared with ([`baseline`]: arrow-rs
//! plus a copy to the device, and a real pinned host-to-device copy) and the
//! side-by-side suite's measurements ([`suite`]).
//!
//! Tests of the other crates take their TPC-H data from here as a
//! dev-dependency (without the `datafusion` feature for the core crate).

#![warn(missing_docs)]

pub mod baseline;
pub mod suite;
pub mod tpch;

/// Median of `values`, sorted in place; `None` when empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    Some(if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 })
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(super::median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(super::median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(super::median(&mut []), None);
    }
}
