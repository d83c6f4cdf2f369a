//! What a scan reads: the row groups (with their page-index row selections)
//! left after pruning, and how they are cut into partitions.
//!
//! A scan unit is one row group of one file. Partitions are contiguous runs
//! of units in file order, balanced by the compressed bytes of the projected
//! columns (by rows when no column is projected), at most one partition per
//! unit and at most `target_partitions` of them.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use parquet::arrow::arrow_reader::RowSelection;

use crate::file::GpqFile;
use crate::pruning::{PagePruner, prune_row_groups};

/// One row group to read.
#[derive(Debug, Clone)]
pub(crate) struct ScanUnit {
    /// Index of the file in the table.
    pub file: usize,
    /// Row group in that file.
    pub row_group: usize,
    /// Rows of the row group.
    pub rg_rows: usize,
    /// Rows the page index left (all when `None`).
    pub selection: Option<RowSelection>,
    /// Rows the scan outputs for this unit.
    pub rows: usize,
    /// Compressed bytes of the projected column chunks.
    pub bytes: u64,
}

/// What pruning did, for `EXPLAIN` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruningSummary {
    /// Files of the table.
    pub files: usize,
    /// Row groups of all files.
    pub row_groups: usize,
    /// Row groups dropped because their statistics rule out the filter.
    pub pruned_by_statistics: usize,
    /// Row groups dropped because the page index rules out all their pages.
    pub pruned_by_page_index: usize,
    /// Rows of scanned row groups skipped through the page index.
    pub rows_pruned_by_page_index: usize,
    /// Row groups not needed to satisfy the limit.
    pub pruned_by_limit: usize,
    /// Row groups left to read.
    pub scanned: usize,
    /// Rows left to read (saturating at `usize::MAX`).
    pub rows: usize,
}

/// Prunes the row groups of `files` and returns what is left to read.
pub(crate) fn plan_units(
    files: &[GpqFile],
    table_schema: &SchemaRef,
    columns: &[usize],
    predicate: Option<&Arc<dyn PhysicalExpr>>,
    page_index: bool,
    limit: Option<usize>,
) -> (Vec<ScanUnit>, PruningSummary) {
    let mut summary = PruningSummary {
        files: files.len(),
        ..Default::default()
    };
    let row_pruner = predicate.and_then(|p| {
        PruningPredicateBuilder::new()
            .with_file_schema(Arc::clone(table_schema))
            .build(Arc::clone(p))
    });
    let page_pruner = predicate
        .filter(|_| page_index)
        .map(|p| PagePruner::new(p, table_schema))
        .filter(|p| !p.is_empty());

    let mut units = Vec::new();
    for (fi, file) in files.iter().enumerate() {
        let all: Vec<usize> = (0..file.metadata().num_row_groups()).collect();
        summary.row_groups += all.len();
        let keep = match &row_pruner {
            Some(p) => prune_row_groups(p, file, &all),
            None => vec![true; all.len()],
        };
        for (rg, kept) in all.into_iter().zip(keep) {
            if !kept {
                summary.pruned_by_statistics += 1;
                continue;
            }
            let rg_rows = file.row_group_rows(rg);
            let selection = page_pruner.as_ref().and_then(|p| p.prune(file, rg));
            let rows = selection.as_ref().map_or(rg_rows, |s| s.row_count());
            if rows == 0 && rg_rows > 0 {
                summary.pruned_by_page_index += 1;
                continue;
            }
            summary.rows_pruned_by_page_index = summary
                .rows_pruned_by_page_index
                .saturating_add(rg_rows.saturating_sub(rows));
            // A selection that keeps every row is no selection.
            let selection = selection.filter(|_| rows < rg_rows);
            let bytes = file.projected_bytes(rg, columns);
            units.push(ScanUnit {
                file: fi,
                row_group: rg,
                rg_rows,
                selection,
                rows,
                bytes,
            });
        }
    }
    if let Some(limit) = limit {
        let mut rows = 0usize;
        let needed = units.iter().position(|u| {
            rows = rows.saturating_add(u.rows);
            rows >= limit
        });
        if let Some(last) = needed {
            summary.pruned_by_limit = units.len() - (last + 1);
            units.truncate(last + 1);
        }
    }
    summary.scanned = units.len();
    summary.rows = units
        .iter()
        .map(|u| u.rows)
        .fold(0usize, usize::saturating_add);
    (units, summary)
}

/// Cuts `units` into at most `target` contiguous partitions of similar weight.
pub(crate) fn split_partitions(
    units: Vec<ScanUnit>,
    target: usize,
    by_rows: bool,
) -> Vec<Vec<ScanUnit>> {
    let n = target.max(1).min(units.len());
    if n <= 1 {
        return vec![units];
    }
    let weight = |u: &ScanUnit| {
        if by_rows {
            u.rows as u64
        } else {
            u.bytes.max(1)
        }
    };
    let total: u64 = units.iter().map(weight).fold(0u64, u64::saturating_add);
    let mut parts: Vec<Vec<ScanUnit>> = Vec::with_capacity(n);
    let mut current = Vec::new();
    let mut acc = 0u64;
    let count = units.len();
    for (i, unit) in units.into_iter().enumerate() {
        acc = acc.saturating_add(weight(&unit));
        current.push(unit);
        let left_units = count - i - 1;
        let left_parts = n - parts.len() - 1;
        // Close the partition at its share of the total, or when every later
        // partition needs one of the remaining units.
        let share = total as u128 * (parts.len() as u128 + 1) / n as u128;
        if left_parts > 0 && (acc as u128 >= share || left_units == left_parts) {
            parts.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

#[cfg(test)]
impl ScanUnit {
    /// For tests: all `rg_rows` rows of row group 0 of file 0, with `bytes`
    /// projected compressed bytes.
    pub fn whole(rg_rows: usize, bytes: u64) -> ScanUnit {
        ScanUnit { file: 0, row_group: 0, rg_rows, selection: None, rows: rg_rows, bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(bytes: u64) -> ScanUnit {
        ScanUnit::whole(10, bytes)
    }

    #[test]
    fn splits_evenly_and_never_empty() {
        let parts = split_partitions((0..10).map(|_| unit(5)).collect(), 4, false);
        assert_eq!(parts.len(), 4);
        assert!(parts.iter().all(|p| !p.is_empty()));
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 10);

        let parts = split_partitions(vec![unit(1000), unit(1), unit(1)], 3, false);
        assert_eq!(
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![1, 1, 1]
        );

        let parts = split_partitions(vec![unit(1), unit(1)], 8, false);
        assert_eq!(parts.len(), 2);
        assert_eq!(split_partitions(Vec::new(), 8, false).len(), 1);
    }
}
