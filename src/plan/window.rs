//! Row windows: a plan cut to a contiguous range of its rows, reading only
//! the pages that hold them.
//!
//! [`ReadPlan::with_row_window`] keeps rows `skip..skip + keep` of a plan.
//! Row groups with none of them are dropped. In the row groups at the
//! window's edges, a flat column's chunk with an offset index is read from
//! the page holding the window's first row to the page holding its last;
//! the bytes in front of the first data page (the dictionary page) are read
//! too, so such a chunk may be two spans, and the page walk on the device
//! resumes after the skipped pages (`ChunkPlan::resume`). Each column then
//! decodes its own run of rows (page boundaries differ between columns),
//! and [`ReadPlan::lead_rows`] says how many of them come before the window;
//! the decoder cuts every column to the window on the device, without a
//! copy (Arrow offsets).
//!
//! The offset index is untrusted like the rest of the footer: a chunk's
//! entries must start at row 0, grow strictly in rows, lie inside the chunk
//! and follow one another without gaps, or the chunk is read whole. What
//! the pages read then hold is checked against what the index promised
//! (their value count), as for any chunk; an index whose row numbers are
//! consistent but wrong cannot be told from a right one without reading the
//! skipped pages (arrow-rs trusts it the same way). Nested columns (lists,
//! maps, structs) are read whole.

use parquet::file::page_index::offset_index::PageLocation;
use tracing::debug;

use super::{ChunkResume, ReadPlan, row_group_rows};
use crate::error::{Error, Result};
use crate::options::{IO_ALIGNMENT, IoOptions};
use crate::plan::IoLayout;

/// The data pages of a chunk a window needs: the first and last index into
/// its page locations, and the rows they hold (within the row group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeptPages {
    first: usize,
    last: usize,
    first_row: u64,
    end_row: u64,
}

/// Which pages of a chunk hold rows `want` of its row group (`rg_rows` in
/// all), or `None` where the locations cannot be trusted or every page is
/// needed.
fn kept_pages(locations: &[PageLocation], chunk: (u64, u64), rg_rows: u64, want: (u64, u64)) -> Option<KeptPages> {
    let (chunk_start, chunk_end) = chunk;
    let first = locations.first()?;
    if first.first_row_index != 0 || want.0 >= want.1 || want.1 > rg_rows {
        return None;
    }
    // The data pages follow one another with nothing between them: an
    // index that leaves one out (its rows moved to the next) is refused.
    let mut prev: Option<(u64, u64)> = None; // (end, first row) of the page before
    for l in locations {
        let offset = u64::try_from(l.offset).ok()?;
        let size = u64::try_from(l.compressed_page_size).ok().filter(|&s| s > 0)?;
        let row = u64::try_from(l.first_row_index).ok()?;
        let end = offset.checked_add(size)?;
        let placed = match prev {
            None => offset >= chunk_start,
            Some((prev_end, prev_row)) => offset == prev_end && row > prev_row,
        };
        if !placed || end > chunk_end || row >= rg_rows {
            return None;
        }
        prev = Some((end, row));
    }
    let row_of = |k: usize| locations[k].first_row_index as u64;
    let first = locations.partition_point(|l| (l.first_row_index as u64) <= want.0) - 1;
    let last = locations.partition_point(|l| (l.first_row_index as u64) < want.1) - 1;
    if first == 0 && last == locations.len() - 1 {
        return None;
    }
    let end_row = if last + 1 < locations.len() { row_of(last + 1) } else { rg_rows };
    Some(KeptPages { first, last, first_row: row_of(first), end_row })
}

impl ReadPlan {
    /// Keeps rows `skip..skip + keep` of the plan (clamped to its rows),
    /// reading only the row groups, and in flat columns with an offset
    /// index only the pages, that hold them; see the `plan::window` module doc.
    /// The IO layout is planned anew.
    pub fn with_row_window(mut self, skip: u64, keep: u64, io: &IoOptions) -> Result<ReadPlan> {
        let task_size = io.resolved_task_size()?;
        if self.num_rows != self.group_rows || self.chunks.iter().any(|c| c.resume.is_some() || c.first_row != 0) {
            return Err(Error::InvalidOptions("a plan already cut to a row window cannot be cut again; plan anew".into()));
        }
        let skip = skip.min(self.num_rows);
        let keep = keep.min(self.num_rows - skip);
        if skip == 0 && keep == self.num_rows {
            return Ok(self);
        }
        if keep == 0 {
            self.row_groups.clear();
            self.chunks.clear();
            self.num_rows = 0;
            self.group_rows = 0;
            self.lead_rows = vec![0; self.columns.len()];
            self.plan_io(io.merge_gap, task_size);
            return Ok(self);
        }
        // The row groups' rows in the plan, in order (row groups of no rows have no chunks).
        let mut starts: Vec<(usize, u64, u64)> = Vec::new(); // (row group, first row in the plan, rows)
        let mut at = 0u64;
        for &rg in &self.row_groups {
            let rows = row_group_rows(&self.metadata, rg);
            starts.push((rg, at, rows));
            at += rows;
        }
        let (lo, hi) = (skip, skip + keep);
        let kept_rgs: Vec<(usize, u64, u64)> =
            starts.into_iter().filter(|&(_, start, rows)| rows > 0 && start < hi && start + rows > lo).collect();
        let window_start = kept_rgs.first().map_or(0, |&(_, start, _)| start);
        self.row_groups.retain(|rg| kept_rgs.iter().any(|&(k, _, _)| k == *rg));
        self.chunks.retain(|c| kept_rgs.iter().any(|&(k, _, _)| k == c.row_group));
        self.num_rows = keep;
        self.group_rows = kept_rgs.iter().map(|&(_, _, rows)| rows).sum();
        // Rows each column decodes before the window: what the window skips
        // of its first row group, less what its skipped pages do.
        self.lead_rows = vec![lo - window_start.min(lo); self.columns.len()];

        let offset_index = self.metadata.offset_index().cloned();
        for c in &mut self.chunks {
            let Some(&(rg, start, rows)) = kept_rgs.iter().find(|&&(k, _, _)| k == c.row_group) else { continue };
            let want = (lo.max(start) - start, hi.min(start + rows) - start);
            let column = &self.columns[c.column];
            let leaf = &column.leaves[c.leaf];
            if !column.is_flat() || want == (0, rows) {
                continue;
            }
            let Some(locations) = offset_index.as_ref().and_then(|oi| oi.get(rg)).and_then(|r| r.get(leaf.leaf_index)) else {
                continue;
            };
            let locations = locations.page_locations();
            let Some(k) = kept_pages(locations, (c.file_offset, c.file_offset + c.len), rows, want) else {
                debug!(row_group = rg, column = %leaf.path, "offset index unusable or not selective; chunk read whole");
                continue;
            };
            let data_start = locations[k.first].offset as u64;
            let data_end = locations[k.last].offset as u64 + locations[k.last].compressed_page_size as u64;
            let prefix_end = locations[0].offset as u64;
            if k.first == 0 {
                c.len = data_end - c.file_offset;
            } else {
                c.resume = Some(ChunkResume {
                    file_offset: data_start,
                    len: data_end - data_start,
                    device_offset: 0,
                    skipped_pages: u32::try_from(k.first).map_err(|_| Error::Internal("page count overflow".into()))?,
                });
                c.len = prefix_end - c.file_offset;
            }
            c.first_row = k.first_row;
            c.num_rows = k.end_row - k.first_row;
            c.num_values = c.num_rows; // a flat column: one value (or null) a row
            if start <= lo {
                self.lead_rows[c.column] = want.0 - k.first_row;
            }
        }
        self.plan_io(io.merge_gap, task_size);
        Ok(self)
    }

    /// Lays the chunks' spans out for IO and sets their device offsets.
    pub(crate) fn plan_io(&mut self, merge_gap: u64, task_size: u64) {
        let mut spans = Vec::with_capacity(self.chunks.len());
        for c in &self.chunks {
            spans.push((c.file_offset, c.len));
            if let Some(r) = &c.resume {
                spans.push((r.file_offset, r.len));
            }
        }
        self.io = IoLayout::build(&spans, self.file_size, IO_ALIGNMENT, merge_gap, task_size);
        let mut offsets = self.io.span_device_offsets.iter();
        for c in &mut self.chunks {
            c.device_offset = offsets.next().copied().unwrap_or(0);
            if let Some(r) = &mut c.resume {
                r.device_offset = offsets.next().copied().unwrap_or(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(offset: i64, size: i32, row: i64) -> PageLocation {
        PageLocation { offset, compressed_page_size: size, first_row_index: row }
    }

    #[test]
    fn pages_holding_the_window_are_kept() {
        // Four pages of 100 rows at 1000, 1100, 1200, 1300 (a dictionary page before 1000).
        let l = [loc(1000, 100, 0), loc(1100, 100, 100), loc(1200, 100, 200), loc(1300, 100, 300)];
        let chunk = (900, 1400);
        assert_eq!(kept_pages(&l, chunk, 400, (150, 250)), Some(KeptPages { first: 1, last: 2, first_row: 100, end_row: 300 }));
        assert_eq!(kept_pages(&l, chunk, 400, (100, 200)), Some(KeptPages { first: 1, last: 1, first_row: 100, end_row: 200 }));
        assert_eq!(kept_pages(&l, chunk, 400, (0, 1)), Some(KeptPages { first: 0, last: 0, first_row: 0, end_row: 100 }));
        assert_eq!(kept_pages(&l, chunk, 400, (399, 400)), Some(KeptPages { first: 3, last: 3, first_row: 300, end_row: 400 }));
        // Every page needed: nothing to prune.
        assert_eq!(kept_pages(&l, chunk, 400, (50, 350)), None);
    }

    #[test]
    fn untrustworthy_locations_read_the_chunk_whole() {
        let chunk = (900, 1400);
        let want = (150, 250);
        // Not from row 0; rows not increasing; overlapping; outside the chunk; empty page; rows past the group.
        assert_eq!(kept_pages(&[loc(1000, 100, 5), loc(1100, 100, 100)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[loc(1000, 100, 0), loc(1100, 100, 0)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[loc(1000, 150, 0), loc(1100, 100, 100)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[loc(1000, 100, 0), loc(1350, 100, 100)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[loc(1000, 0, 0), loc(1100, 100, 100)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[loc(800, 100, 0), loc(1100, 100, 100)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[loc(1000, 100, 0), loc(1100, 100, 400)], chunk, 400, want), None);
        assert_eq!(kept_pages(&[], chunk, 400, want), None);
        // A page left out of the index (a gap between two entries).
        assert_eq!(kept_pages(&[loc(1000, 100, 0), loc(1200, 100, 100)], chunk, 400, want), None);
    }
}
