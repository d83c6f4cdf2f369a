//! Statistics for the planner from the footers: row counts (exact), and per
//! column null counts (exact unless pages were skipped) and min/max (always
//! reported inexact: Parquet may truncate them, and the planner only needs
//! them for estimates).

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};

use crate::file::GpqFile;
use crate::pruning::RowGroupStatistics;
use crate::units::ScanUnit;

/// Statistics of the given table `columns` over the row groups in `units`.
///
/// `fetch` caps each partition's rows (a pushed-down limit); `units` are
/// given per partition so that the cap applies per partition.
pub(crate) fn statistics<'a>(
    files: &[GpqFile],
    table_schema: &SchemaRef,
    columns: &[usize],
    partitions: impl IntoIterator<Item = &'a [ScanUnit]>,
    fetch: Option<usize>,
) -> Statistics {
    let mut num_rows = 0usize;
    let mut selected = false;
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); files.len()];
    for part in partitions {
        let rows: usize = part.iter().map(|u| u.rows).sum();
        num_rows += fetch.map_or(rows, |f| rows.min(f));
        for u in part {
            selected |= u.selection.is_some();
            groups[u.file].push(u.row_group);
        }
    }
    let limited = fetch.is_some();
    let column_statistics = columns
        .iter()
        .map(|&c| {
            let name = table_schema.field(c).name();
            let mut stats = ColumnStatistics::new_unknown()
                .with_null_count(Precision::Exact(0))
                .with_min_value(Precision::Absent)
                .with_max_value(Precision::Absent);
            let mut first = true;
            for (file, rgs) in files.iter().zip(&groups) {
                if rgs.is_empty() {
                    continue;
                }
                let s = RowGroupStatistics::new(file, rgs);
                let nulls = s
                    .nulls(name)
                    .filter(|n| n.null_count() == 0)
                    .map(|n| n.values().iter().sum::<u64>() as usize);
                let min = s.mins(name).and_then(|a| extreme(&a, true));
                let max = s.maxes(name).and_then(|a| extreme(&a, false));
                stats.null_count = match nulls {
                    Some(n) => stats.null_count.add(&Precision::Exact(n)),
                    None => Precision::Absent,
                };
                let (min, max) = (inexact(min), inexact(max));
                if first {
                    stats.min_value = min;
                    stats.max_value = max;
                    first = false;
                } else {
                    stats.min_value = stats.min_value.min(&min);
                    stats.max_value = stats.max_value.max(&max);
                }
            }
            if selected || limited {
                stats.null_count = stats.null_count.to_inexact();
            }
            stats
        })
        .collect();
    Statistics {
        num_rows: Precision::Exact(num_rows),
        total_byte_size: Precision::Absent,
        column_statistics,
    }
}

fn inexact(v: Option<ScalarValue>) -> Precision<ScalarValue> {
    v.map_or(Precision::Absent, Precision::Inexact)
}

/// The smallest (or largest) value of a statistics array; `None` if any is unknown.
fn extreme(values: &ArrayRef, min: bool) -> Option<ScalarValue> {
    if values.is_empty() || values.null_count() > 0 {
        return None;
    }
    let mut best = ScalarValue::try_from_array(values, 0).ok()?;
    for i in 1..values.len() {
        let v = ScalarValue::try_from_array(values, i).ok()?;
        let better = match v.partial_cmp(&best)? {
            std::cmp::Ordering::Less => min,
            std::cmp::Ordering::Greater => !min,
            std::cmp::Ordering::Equal => false,
        };
        if better {
            best = v;
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;

    use super::*;

    #[test]
    fn extremes() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![3, -1, 7]));
        assert_eq!(extreme(&a, true), Some(ScalarValue::Int64(Some(-1))));
        assert_eq!(extreme(&a, false), Some(ScalarValue::Int64(Some(7))));
        let n: ArrayRef = Arc::new(Int64Array::from(vec![Some(3), None]));
        assert_eq!(extreme(&n, true), None);
    }
}
