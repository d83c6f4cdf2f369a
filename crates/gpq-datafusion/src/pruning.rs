//! Pruning with Parquet statistics: whole row groups from their column-chunk
//! statistics, and pages from the page index.
//!
//! Both feed DataFusion's [`PruningPredicate`] through [`PruningStatistics`]
//! implementations built on parquet's [`StatisticsConverter`]. Missing
//! statistics never prune: a missing null count is unknown, not zero.
//!
//! Page pruning follows DataFusion's own scheme: the filter is split into
//! conjuncts, each conjunct over a single column is evaluated against that
//! column's page statistics in a row group, and the resulting row selections
//! (pages of different columns have different row boundaries) are intersected.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, UInt64Array};
use arrow::datatypes::SchemaRef;
use datafusion::common::pruning::PruningStatistics;
use datafusion::catalog::Session;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{PhysicalExpr, conjunction_opt, split_conjunction};
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::file::metadata::RowGroupMetaData;
use tracing::debug;

use crate::file::GpqFile;

/// One physical predicate over `schema` from the filters DataFusion pushed
/// down (volatile ones and those that cannot be planned left out): what
/// pruning evaluates, and what `EXPLAIN` shows as the scan's `predicate`.
pub(crate) fn pushed_predicate(
    state: &dyn Session,
    schema: &SchemaRef,
    filters: &[Expr],
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    if filters.is_empty() {
        return Ok(None);
    }
    let df_schema = DFSchema::try_from(Arc::clone(schema))?;
    let exprs = filters.iter().filter(|e| !e.is_volatile()).filter_map(|e| {
        state
            .create_physical_expr(e.clone(), &df_schema)
            .inspect_err(|err| debug!("filter {e} not used for pruning: {err}"))
            .ok()
    });
    Ok(conjunction_opt(exprs))
}

/// Statistics of some row groups of one file, one container per row group.
pub(crate) struct RowGroupStatistics<'a> {
    file: &'a GpqFile,
    row_groups: &'a [usize],
}

impl<'a> RowGroupStatistics<'a> {
    /// Statistics of `row_groups` of `file`.
    pub fn new(file: &'a GpqFile, row_groups: &'a [usize]) -> Self {
        RowGroupStatistics { file, row_groups }
    }

    fn converter(&self, column: &str) -> Option<StatisticsConverter<'a>> {
        StatisticsConverter::try_new(
            column,
            self.file.schema().as_ref(),
            self.file.parquet_schema(),
        )
        .map(|c| c.with_missing_null_counts_as_zero(false))
        .inspect_err(|e| debug!("no statistics for column {column}: {e}"))
        .ok()
    }

    fn metadatas(&self) -> impl Iterator<Item = &'a RowGroupMetaData> + 'a {
        let md = self.file.metadata();
        self.row_groups.iter().map(move |&rg| md.row_group(rg))
    }

    /// Minimums of `column`, one per row group (null where unknown).
    pub fn mins(&self, column: &str) -> Option<ArrayRef> {
        self.converter(column)?
            .row_group_mins(self.metadatas())
            .ok()
    }

    /// Maximums of `column`, one per row group (null where unknown).
    pub fn maxes(&self, column: &str) -> Option<ArrayRef> {
        self.converter(column)?
            .row_group_maxes(self.metadatas())
            .ok()
    }

    /// Null counts of `column`, one per row group (null where unknown).
    pub fn nulls(&self, column: &str) -> Option<UInt64Array> {
        self.converter(column)?
            .row_group_null_counts(self.metadatas())
            .ok()
    }
}

impl PruningStatistics for RowGroupStatistics<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.mins(&column.name)
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.maxes(&column.name)
    }

    fn num_containers(&self) -> usize {
        self.row_groups.len()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        self.nulls(&column.name).map(|a| Arc::new(a) as ArrayRef)
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        let counts: UInt64Array = self
            .metadatas()
            .map(|rg| u64::try_from(rg.num_rows()).ok())
            .collect();
        Some(Arc::new(counts))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}

/// Which of `row_groups` of `file` may hold matching rows (`true`: keep).
pub(crate) fn prune_row_groups(
    predicate: &PruningPredicate,
    file: &GpqFile,
    row_groups: &[usize],
) -> Vec<bool> {
    match predicate.prune(&RowGroupStatistics::new(file, row_groups)) {
        Ok(keep) if keep.len() == row_groups.len() => keep,
        Ok(_) => vec![true; row_groups.len()],
        Err(e) => {
            debug!(file = %file.path.display(), "row-group pruning failed, keeping all: {e}");
            vec![true; row_groups.len()]
        }
    }
}

/// Page statistics of one column in one row group, one container per page.
struct PageStatistics<'a> {
    converter: StatisticsConverter<'a>,
    file: &'a GpqFile,
    row_group: [usize; 1],
    page_rows: Vec<usize>,
}

impl PruningStatistics for PageStatistics<'_> {
    fn min_values(&self, _column: &Column) -> Option<ArrayRef> {
        let md = self.file.metadata();
        self.converter
            .data_page_mins(md.column_index()?, md.offset_index()?, &self.row_group)
            .ok()
    }

    fn max_values(&self, _column: &Column) -> Option<ArrayRef> {
        let md = self.file.metadata();
        self.converter
            .data_page_maxes(md.column_index()?, md.offset_index()?, &self.row_group)
            .ok()
    }

    fn num_containers(&self) -> usize {
        self.page_rows.len()
    }

    fn null_counts(&self, _column: &Column) -> Option<ArrayRef> {
        let md = self.file.metadata();
        let counts = self
            .converter
            .data_page_null_counts(md.column_index()?, md.offset_index()?, &self.row_group)
            .ok()?;
        Some(Arc::new(counts))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        let counts: UInt64Array = self.page_rows.iter().map(|&n| Some(n as u64)).collect();
        Some(Arc::new(counts))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}

/// Prunes pages with the single-column conjuncts of a filter.
#[derive(Debug)]
pub(crate) struct PagePruner {
    predicates: Vec<(PruningPredicate, String)>,
}

impl PagePruner {
    /// Builds one pruning predicate per single-column conjunct of `predicate`.
    pub fn new(predicate: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> PagePruner {
        let predicates = split_conjunction(predicate)
            .into_iter()
            .filter_map(|conjunct| {
                let pp = PruningPredicateBuilder::new()
                    .with_file_schema(Arc::clone(schema))
                    .try_build(Arc::clone(conjunct))
                    .inspect_err(|e| debug!("no page pruning for {conjunct}: {e}"))
                    .ok()?;
                if pp.always_true() {
                    return None;
                }
                let column = pp.required_columns().single_column()?.name().to_string();
                Some((pp, column))
            })
            .collect();
        PagePruner { predicates }
    }

    /// Whether no conjunct can prune pages.
    pub fn is_empty(&self) -> bool {
        self.predicates.is_empty()
    }

    /// The rows of row group `rg` of `file` that may match, or `None` when
    /// the page index cannot narrow the row group down.
    pub fn prune(&self, file: &GpqFile, rg: usize) -> Option<RowSelection> {
        let md = file.metadata();
        let (column_index, offset_index) = (md.column_index()?, md.offset_index()?);
        let rg_rows = file.row_group_rows(rg);
        let mut selection: Option<RowSelection> = None;
        for (predicate, column) in &self.predicates {
            let Ok(converter) =
                StatisticsConverter::try_new(column, file.schema().as_ref(), file.parquet_schema())
            else {
                continue;
            };
            let Some(leaf) = converter.parquet_column_index() else {
                continue;
            };
            if column_index.get(rg).and_then(|c| c.get(leaf)).is_none() {
                continue;
            }
            let Some(locations) = offset_index
                .get(rg)
                .and_then(|c| c.get(leaf))
                .map(|o| o.page_locations())
            else {
                continue;
            };
            let Some(page_rows) =
                page_row_counts(locations.iter().map(|l| l.first_row_index), rg_rows)
            else {
                continue;
            };
            let stats = PageStatistics {
                converter,
                file,
                row_group: [rg],
                page_rows,
            };
            let keep = match predicate.prune(&stats) {
                Ok(k) if k.len() == stats.page_rows.len() => k,
                Ok(_) => continue,
                Err(e) => {
                    debug!(file = %file.path.display(), rg, column, "page pruning failed: {e}");
                    continue;
                }
            };
            let this = selection_from_pages(&stats.page_rows, &keep);
            let merged = match selection {
                None => this,
                Some(s) => s.intersection(&this),
            };
            let any = merged.selects_any();
            selection = Some(merged);
            if !any {
                break;
            }
        }
        selection
    }
}

/// Rows of each page from the pages' first row indices; `None` if inconsistent.
fn page_row_counts(first_rows: impl Iterator<Item = i64>, rg_rows: usize) -> Option<Vec<usize>> {
    let firsts: Vec<usize> = first_rows
        .map(|f| usize::try_from(f).ok())
        .collect::<Option<_>>()?;
    if firsts.first() != Some(&0) {
        return None;
    }
    let mut counts = Vec::with_capacity(firsts.len());
    for (i, &start) in firsts.iter().enumerate() {
        let end = firsts.get(i + 1).copied().unwrap_or(rg_rows);
        counts.push(end.checked_sub(start)?);
    }
    Some(counts)
}

/// A row selection keeping the rows of the pages marked `true`.
fn selection_from_pages(page_rows: &[usize], keep: &[bool]) -> RowSelection {
    let mut selectors: Vec<RowSelector> = Vec::new();
    for (&rows, &k) in page_rows.iter().zip(keep) {
        match selectors.last_mut() {
            Some(last) if last.skip != k => last.row_count += rows,
            _ => selectors.push(if k {
                RowSelector::select(rows)
            } else {
                RowSelector::skip(rows)
            }),
        }
    }
    RowSelection::from(selectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rows_and_selection() {
        assert_eq!(
            page_row_counts([0i64, 10, 25].into_iter(), 30),
            Some(vec![10, 15, 5])
        );
        assert_eq!(page_row_counts([0i64, 40].into_iter(), 30), None);
        assert_eq!(page_row_counts([5i64].into_iter(), 30), None);
        let s = selection_from_pages(&[10, 15, 5], &[false, true, true]);
        assert_eq!(s.row_count(), 20);
        assert_eq!(s.skipped_row_count(), 10);
        assert_eq!(s.iter().count(), 2);
    }
}
