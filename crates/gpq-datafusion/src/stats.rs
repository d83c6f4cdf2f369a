//! Statistics for the planner from the footers: row counts (exact), per
//! column null counts (exact unless pages were skipped) and min/max (always
//! reported inexact: Parquet may truncate them, and the planner only needs
//! them for estimates), and the output's size in bytes the way DataFusion's
//! own Parquet scan puts it: rows times the widths of fixed-width columns
//! (exact where the rows are), plus the footers' uncompressed sizes of the
//! other columns' chunks (inexact), per column (`byte_size`, from which
//! joins and projections above the scan estimate their own output's size)
//! and in total. Planners choose joins by that size:
//! Ballista's adaptive joins broadcast a side under a byte threshold, and
//! without a size they fell back to a row threshold and shuffled both
//! sides where the built-in scan's plan broadcast one (TPC-H q7 at SF1 ran
//! at half its speed).
//!
//! Footers are input, not facts: every sum is checked, and a count that
//! overflows (or a null count that exceeds its row group's rows) is reported
//! `Absent` rather than wrong, so the planner never answers a query from it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, UInt64Array};
use arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, DFSchema, ScalarValue, Statistics};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::physical_expr::{conjunction_opt, create_physical_expr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExecBuilder;
use datafusion::physical_plan::statistics::StatisticsArgs;

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
    filtered: bool,
) -> Statistics {
    // `None` once the sum overflows.
    let mut num_rows = Some(0usize);
    let mut selected = false;
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); files.len()];
    let mut all_units: Vec<&ScanUnit> = Vec::new();
    for part in partitions {
        all_units.extend(part.iter());
        let rows = checked_sum(part.iter().map(|u| u.rows));
        let rows = match (rows, fetch) {
            (Some(r), f) => Some(f.map_or(r, |f| r.min(f))),
            // More rows than a usize holds, but the partition stops at the limit.
            (None, Some(f)) => Some(f),
            (None, None) => None,
        };
        num_rows = num_rows.zip(rows).and_then(|(a, b)| a.checked_add(b));
        for u in part {
            selected |= u.selection.is_some();
            if let Some(g) = groups.get_mut(u.file) {
                g.push(u.row_group);
            }
        }
    }
    let limited = fetch.is_some();
    // The scan's own filters keep an unknown part of the rows.
    let num_rows = match num_rows {
        Some(n) if filtered => Precision::Inexact(n),
        Some(n) => Precision::Exact(n),
        None => Precision::Absent,
    };
    let column_statistics: Vec<ColumnStatistics> = columns
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
                let nulls = s.nulls(name).and_then(|n| null_total(file, rgs, &n));
                let min = s.mins(name).and_then(|a| extreme(&a, true));
                let max = s.maxes(name).and_then(|a| extreme(&a, false));
                stats.null_count = add_count(&stats.null_count, nulls);
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
            if selected || limited || filtered {
                stats.null_count = stats.null_count.to_inexact();
            }
            // Joins and projections above the scan estimate their output size from these.
            stats.byte_size = column_bytes(files, table_schema, c, &all_units, &num_rows);
            stats
        })
        .collect();
    let total_byte_size = output_bytes(&column_statistics);
    Statistics { num_rows, total_byte_size, column_statistics }
}

/// Statistics of the given table `columns` over the row groups in `units`
/// after the scan's own filters `own_filters` (which it reports `Exact`, so
/// DataFusion plans no filter above it): the whole table's statistics over
/// those row groups, through DataFusion's own filter estimate (interval
/// analysis of the predicate where it allows, else its default
/// selectivity), then projected to `columns`. That is what a `FilterExec`
/// above DataFusion's Parquet scan reports, so that the planner chooses the
/// same joins over both: with every row counted, a filtered lineitem looked
/// larger than orders or part, and TPC-H q12 and q14 built their hash
/// tables on the larger side. `fetch` caps each partition's rows. Where the
/// filters do not convert to a physical predicate, every row is counted
/// (inexact), as before.
pub(crate) fn filtered_statistics<'a>(
    files: &[GpqFile],
    table_schema: &SchemaRef,
    columns: &[usize],
    partitions: impl IntoIterator<Item = &'a [ScanUnit]>,
    fetch: Option<usize>,
    own_filters: &[Expr],
) -> Statistics {
    let partitions: Vec<&[ScanUnit]> = partitions.into_iter().collect();
    let estimate = || -> Option<Statistics> {
        let df_schema = DFSchema::try_from(Arc::clone(table_schema)).ok()?;
        let props = ExecutionProps::new();
        let predicate = conjunction_opt(own_filters.iter().filter(|e| !e.is_volatile()).filter_map(|e| create_physical_expr(e, &df_schema, &props, &PhysicalPlanningContext::default()).ok()))?;
        let all: Vec<usize> = (0..table_schema.fields().len()).collect();
        let base = statistics(files, table_schema, &all, partitions.iter().copied(), None, false);
        let filter = FilterExecBuilder::new(predicate, Arc::new(EmptyExec::new(Arc::clone(table_schema)))).apply_projection(Some(columns.to_vec())).ok()?.build().ok()?;
        let mut out = Arc::unwrap_or_clone(filter.statistics_from_inputs(&[Arc::new(base)], &StatisticsArgs::new()).ok()?);
        if let Some(cap) = fetch.and_then(|f| f.checked_mul(partitions.len())) {
            out.num_rows = match out.num_rows {
                Precision::Exact(n) | Precision::Inexact(n) if n > cap => Precision::Inexact(cap),
                other => other,
            };
        }
        (out.column_statistics.len() == columns.len()).then_some(out)
    };
    estimate().unwrap_or_else(|| statistics(files, table_schema, columns, partitions.iter().copied(), fetch, true))
}

/// The size of column `c` in the scan's output (see the module docs):
/// `num_rows` times its width where it has a fixed width, else the
/// uncompressed sizes of its chunks in `units` (scaled to the rows the units
/// keep, and to `num_rows` where a limit cuts them). `Absent` where a size
/// is unknown, negative or overflows.
fn column_bytes(files: &[GpqFile], table_schema: &SchemaRef, c: usize, units: &[&ScanUnit], num_rows: &Precision<usize>) -> Precision<usize> {
    if let Some(width) = table_schema.field(c).data_type().primitive_width() {
        return num_rows.multiply(&Precision::Exact(width));
    }
    let mut bytes = 0u128;
    let mut unit_rows = 0u128;
    for u in units {
        let Some(file) = files.get(u.file) else { return Precision::Absent };
        let Some(rg) = file.metadata().row_groups().get(u.row_group) else { return Precision::Absent };
        let mut chunks = 0u128;
        // A column the file lacks reads as nulls: no bytes of its own.
        if let Some(leaves) = file.roots.get(c).and_then(|&r| file.root_leaves.get(r)) {
            for &leaf in leaves {
                let Some(size) = rg.columns().get(leaf).and_then(|chunk| u64::try_from(chunk.uncompressed_size()).ok()) else { return Precision::Absent };
                chunks += u128::from(size);
            }
        }
        bytes += chunks * u.rows as u128 / (u.rg_rows.max(1) as u128);
        unit_rows += u.rows as u128;
    }
    if let Some(&rows) = num_rows.get_value()
        && (rows as u128) < unit_rows
    {
        bytes = bytes * rows as u128 / unit_rows;
    }
    usize::try_from(bytes).map_or(Precision::Absent, Precision::Inexact)
}

/// The sum of the columns' sizes: exact where every one is, `Absent` where
/// one is unknown or the sum overflows.
fn output_bytes(columns: &[ColumnStatistics]) -> Precision<usize> {
    columns.iter().try_fold(Precision::Exact(0usize), |acc, c| {
        let sum = acc.get_value()?.checked_add(*c.byte_size.get_value()?)?;
        Some(if acc.is_exact() == Some(true) && c.byte_size.is_exact() == Some(true) { Precision::Exact(sum) } else { Precision::Inexact(sum) })
    })
    .unwrap_or(Precision::Absent)
}

/// The sum of `values`, `None` if it overflows.
fn checked_sum(values: impl IntoIterator<Item = usize>) -> Option<usize> {
    values
        .into_iter()
        .try_fold(0usize, |acc, v| acc.checked_add(v))
}

/// The nulls of one column over the row groups `rgs` of `file`, from their
/// per-row-group counts `counts`; `None` (unknown) when a count is missing,
/// exceeds its row group's rows, or the sum overflows.
fn null_total(file: &GpqFile, rgs: &[usize], counts: &UInt64Array) -> Option<usize> {
    if counts.null_count() > 0 || counts.len() != rgs.len() {
        return None;
    }
    let mut total = 0usize;
    for (&n, &rg) in counts.values().iter().zip(rgs) {
        let n = usize::try_from(n).ok()?;
        if n > file.row_group_rows(rg) {
            return None;
        }
        total = total.checked_add(n)?;
    }
    Some(total)
}

/// `acc + n`, where a missing `n` or an overflow makes the count unknown.
fn add_count(acc: &Precision<usize>, n: Option<usize>) -> Precision<usize> {
    let Some(n) = n else {
        return Precision::Absent;
    };
    match acc {
        Precision::Exact(a) => a.checked_add(n).map_or(Precision::Absent, Precision::Exact),
        Precision::Inexact(a) => a
            .checked_add(n)
            .map_or(Precision::Absent, Precision::Inexact),
        Precision::Absent => Precision::Absent,
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

    #[test]
    fn hostile_footers_give_unknown_statistics() {
        use crate::file::synthetic;
        use crate::units::{plan_units, split_partitions};
        use arrow::datatypes::{DataType, Field, Schema};

        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let files: Vec<GpqFile> = (0..3)
            .map(|_| synthetic::file(&[i64::MAX], i64::MAX as u64).unwrap())
            .collect();
        let (units, summary) = plan_units(&files, &schema, &[0], None, true, None);
        assert_eq!(units.len(), 3);
        assert_eq!(summary.rows, usize::MAX);
        let parts = split_partitions(units.clone(), 2, false);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 3);
        let stats = statistics(&files, &schema, &[0], [units.as_slice()], None, false);
        assert_eq!(stats.num_rows, Precision::Absent);
        assert_eq!(stats.column_statistics[0].null_count, Precision::Absent);
        // One file alone is fine: exact counts.
        let stats = statistics(&files[..1], &schema, &[0], [&units[..1]], None, false);
        assert_eq!(stats.num_rows, Precision::Exact(i64::MAX as usize));
        assert_eq!(
            stats.column_statistics[0].null_count,
            Precision::Exact(i64::MAX as usize)
        );
        // A limit bounds what a partition outputs even when the rows overflow.
        let stats = statistics(&files, &schema, &[0], [units.as_slice()], Some(10), false);
        assert_eq!(stats.num_rows, Precision::Exact(10));
        // More nulls than rows: unknown, not wrong.
        let liar = synthetic::file(&[5], 6).unwrap();
        let (units, _) = plan_units(std::slice::from_ref(&liar), &schema, &[0], None, true, None);
        let stats = statistics(
            std::slice::from_ref(&liar),
            &schema,
            &[0],
            [units.as_slice()],
            None,
            false,
        );
        assert_eq!(stats.column_statistics[0].null_count, Precision::Absent);
        assert_eq!(stats.num_rows, Precision::Exact(5));
    }

    #[test]
    fn sums_that_overflow_are_unknown_not_wrong() {
        assert_eq!(checked_sum([1, 2, 3]), Some(6));
        assert_eq!(checked_sum([usize::MAX, 1]), None);
        assert_eq!(
            add_count(&Precision::Exact(2), Some(3)),
            Precision::Exact(5)
        );
        assert_eq!(
            add_count(&Precision::Exact(usize::MAX), Some(1)),
            Precision::Absent
        );
        assert_eq!(
            add_count(&Precision::Inexact(usize::MAX), Some(1)),
            Precision::Absent
        );
        assert_eq!(add_count(&Precision::Exact(2), None), Precision::Absent);
    }
}
