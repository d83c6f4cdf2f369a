//! A plan split into groups of row groups, for reads whose stages overlap.
//!
//! [`ReadPlan::split_row_groups`] cuts a plan's row groups into consecutive
//! groups of about equal bytes, each a plan of its own with its own IO
//! layout. The read moves the groups' chunks one after another, and the GPU
//! parses and decompresses a group's pages while the next group's bytes are
//! still being read; the groups' chunks, taken in order, are the whole
//! plan's, so the whole plan decodes what they hold as one.

use super::ReadPlan;
use crate::error::Result;
use crate::options::IoOptions;

impl ReadPlan {
    /// The plan's row groups in `groups` consecutive runs of about equal
    /// bytes read (fewer where the plan has fewer row groups with chunks), each as a plan of its
    /// own with its IO laid out anew. One run, the plan itself, when the plan
    /// has fewer than two row groups with chunks, when `groups` is below 2,
    /// or when a row window cut the plan (its chunks may resume after skipped
    /// pages: such plans are small and read in one go).
    pub fn split_row_groups(&self, groups: usize, io: &IoOptions) -> Result<Vec<ReadPlan>> {
        let windowed = self.num_rows != self.group_rows
            || self.lead_rows.iter().any(|&r| r > 0)
            || self.chunks.iter().any(|c| c.resume.is_some() || c.first_row > 0);
        // (row group, bytes, chunks) of each row group with chunks, in plan order.
        let mut per_rg: Vec<(usize, u64, usize)> = Vec::new();
        for c in &self.chunks {
            match per_rg.last_mut() {
                Some((rg, bytes, n)) if *rg == c.row_group => {
                    *bytes = bytes.saturating_add(c.len);
                    *n += 1;
                }
                _ => per_rg.push((c.row_group, c.len, 1)),
            }
        }
        if groups < 2 || per_rg.len() < 2 || windowed {
            return Ok(vec![self.clone()]);
        }
        let n = per_rg.len();
        let groups = groups.min(n);
        // before[i]: the bytes of the first i row groups.
        let mut before = Vec::with_capacity(n + 1);
        before.push(0u64);
        for (_, bytes, _) in &per_rg {
            before.push(before.last().copied().unwrap_or(0).saturating_add(*bytes));
        }
        let total = before[n];
        // Run k ends where the bytes first reach k/groups of the total, each
        // run holding at least one row group and leaving one for each run after it.
        let mut cuts: Vec<usize> = Vec::with_capacity(groups); // cumulative row groups at each run's end
        let mut prev = 0usize;
        for k in 1..groups {
            let target = (total as u128 * k as u128 / groups as u128) as u64;
            let (lo, hi) = (prev + 1, n - (groups - k));
            let end = (lo..=hi).find(|&i| before[i] >= target).unwrap_or(hi);
            // The nearer of the two row-group boundaries around the target.
            let end = if end > lo && target - before[end - 1] < before[end].saturating_sub(target) { end - 1 } else { end };
            cuts.push(end);
            prev = end;
        }
        cuts.push(per_rg.len());
        let task_size = io.resolved_task_size()?;
        let mut plans = Vec::with_capacity(cuts.len());
        let mut start = 0usize;
        let mut chunk_at = 0usize;
        for end in cuts {
            let run: Vec<usize> = per_rg[start..end].iter().map(|(rg, _, _)| *rg).collect();
            let n_chunks: usize = per_rg[start..end].iter().map(|(_, _, n)| n).sum();
            let chunks = self.chunks[chunk_at..chunk_at + n_chunks].to_vec();
            chunk_at += n_chunks;
            let rows = run.iter().map(|&rg| super::row_group_rows(&self.metadata, rg)).fold(0u64, u64::saturating_add);
            let mut plan = ReadPlan {
                path: self.path.clone(),
                file_size: self.file_size,
                metadata: self.metadata.clone(),
                schema: self.schema.clone(),
                columns: self.columns.clone(),
                row_groups: run,
                num_rows: rows,
                group_rows: rows,
                lead_rows: vec![0; self.columns.len()],
                chunks,
                io: Default::default(),
            };
            plan.plan_io(io.merge_gap, task_size);
            plans.push(plan);
            start = end;
        }
        debug_assert_eq!(chunk_at, self.chunks.len());
        Ok(plans)
    }

    /// Bytes the plan reads from the file (its chunks, before alignment).
    pub fn chunk_bytes(&self) -> u64 {
        self.chunks.iter().fold(0u64, |a, c| a.saturating_add(c.len).saturating_add(c.resume.map_or(0, |r| r.len)))
    }
}
