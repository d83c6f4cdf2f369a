//! IO ranges: column-chunk byte ranges rounded out to the IO alignment,
//! neighbours merged across small gaps, and long ranges cut into tasks.
//!
//! The device buffer holds the ranges back to back, each at an offset that is
//! a multiple of the alignment, so a chunk sits in device memory at
//! `range.device_offset + (chunk.file_offset - range.file_offset)`. Bytes read
//! only because of alignment or merging are counted as over-read and never
//! lie inside a chunk's span, so the decoder never sees them as data.

/// One contiguous, aligned read from the file into the device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRange {
    /// Aligned file offset where the read starts.
    pub file_offset: u64,
    /// Bytes actually read: the aligned length, clipped at the end of the file.
    pub read_len: u64,
    /// Space the range takes in the device buffer (aligned, at least `read_len`).
    pub device_len: u64,
    /// Offset of the range in the device buffer (a multiple of the alignment).
    pub device_offset: u64,
}

/// One unit of work for an IO worker: part of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoTask {
    /// File offset to read from (aligned).
    pub file_offset: u64,
    /// Bytes to read.
    pub len: u64,
    /// Where the bytes land in the device buffer.
    pub device_offset: u64,
}

/// The byte spans a read needs, as `(file_offset, len)`.
pub type Span = (u64, u64);

/// The IO side of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoLayout {
    /// Ranges in file order.
    pub ranges: Vec<IoRange>,
    /// Tasks in file order.
    pub tasks: Vec<IoTask>,
    /// Size of the device buffer the ranges need.
    pub device_bytes: u64,
    /// Sum of the requested spans.
    pub bytes_requested: u64,
    /// Sum of the bytes the ranges read (requested plus over-read).
    pub bytes_read: u64,
    /// Device offset of each requested span, in the order given.
    pub span_device_offsets: Vec<u64>,
}

impl IoLayout {
    /// Plans ranges for `spans` in a file of `file_size` bytes.
    ///
    /// `alignment` must be a power of two; `task_size` a multiple of it.
    /// Spans may come in any order; overlapping spans share a range.
    ///
    /// # Panics
    ///
    /// On a bad `alignment` or `task_size`, and where a span's end rounded up
    /// to the alignment does not fit a `u64`. [`ReadPlan`](super::ReadPlan)
    /// only passes spans it has checked to lie inside the file.
    pub fn build(spans: &[Span], file_size: u64, alignment: u64, merge_gap: u64, task_size: u64) -> IoLayout {
        assert!(alignment.is_power_of_two(), "alignment must be a power of two");
        assert!(task_size >= alignment && task_size % alignment == 0, "task size must be a multiple of the alignment");
        let down = |x: u64| x & !(alignment - 1);
        let up = |x: u64| x.div_ceil(alignment) * alignment;

        let mut order: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].1 > 0).collect();
        order.sort_by_key(|&i| spans[i].0);

        // (aligned start, aligned end) of each merged range.
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for &i in &order {
            let (off, len) = spans[i];
            let (start, end) = (down(off), up(off + len));
            match merged.last_mut() {
                Some(last) if start <= last.1.saturating_add(merge_gap) => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }

        let mut layout = IoLayout::default();
        let mut device_offset = 0u64;
        for (start, end) in merged {
            let read_len = end.min(file_size).saturating_sub(start);
            let range = IoRange { file_offset: start, read_len, device_len: end - start, device_offset };
            let mut done = 0;
            while done < read_len {
                let len = task_size.min(read_len - done);
                layout.tasks.push(IoTask {
                    file_offset: start + done,
                    len,
                    device_offset: device_offset + done,
                });
                done += len;
            }
            layout.bytes_read += read_len;
            device_offset += range.device_len;
            layout.ranges.push(range);
        }
        layout.device_bytes = device_offset;
        layout.span_device_offsets = spans
            .iter()
            .map(|&(off, len)| {
                if len == 0 {
                    return 0;
                }
                let r = layout.range_of(off).expect("every span lies in a range");
                r.device_offset + (off - r.file_offset)
            })
            .collect();
        // Requested bytes counted once even where spans overlap.
        let mut covered_end = 0u64;
        for &i in &order {
            let (off, len) = spans[i];
            let start = off.max(covered_end);
            if off + len > start {
                layout.bytes_requested += off + len - start;
            }
            covered_end = covered_end.max(off + len);
        }
        layout
    }

    /// The range holding file byte `offset`, if any.
    pub fn range_of(&self, offset: u64) -> Option<&IoRange> {
        let i = self.ranges.partition_point(|r| r.file_offset + r.device_len <= offset);
        self.ranges.get(i).filter(|r| r.file_offset <= offset)
    }

    /// Bytes read that no span asked for (alignment and merge over-read).
    pub fn over_read(&self) -> u64 {
        self.bytes_read.saturating_sub(self.bytes_requested)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 4096;

    fn check_invariants(spans: &[Span], file_size: u64, l: &IoLayout, task: u64) {
        for r in &l.ranges {
            assert_eq!(r.file_offset % A, 0);
            assert_eq!(r.device_offset % A, 0);
            assert_eq!(r.device_len % A, 0);
            assert!(r.read_len <= r.device_len);
            assert!(r.file_offset + r.read_len <= file_size);
        }
        for w in l.ranges.windows(2) {
            assert!(w[0].file_offset + w[0].device_len <= w[1].file_offset, "ranges overlap");
            assert!(w[0].device_offset + w[0].device_len <= w[1].device_offset);
        }
        // Every requested byte lies in exactly one range, and maps to the same device byte.
        for (i, &(off, len)) in spans.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let holders: Vec<_> = l
                .ranges
                .iter()
                .filter(|r| r.file_offset <= off && off + len <= r.file_offset + r.read_len)
                .collect();
            assert_eq!(holders.len(), 1, "span {i} not covered exactly once");
            let r = holders[0];
            assert_eq!(l.span_device_offsets[i], r.device_offset + off - r.file_offset);
        }
        // Tasks tile the ranges exactly.
        let mut per_range = 0u64;
        for t in &l.tasks {
            assert!(t.len <= task && t.len > 0);
            assert_eq!(t.file_offset % A, 0);
            let r = l.range_of(t.file_offset).unwrap();
            assert!(t.file_offset + t.len <= r.file_offset + r.read_len);
            assert_eq!(t.device_offset, r.device_offset + t.file_offset - r.file_offset);
            per_range += t.len;
        }
        assert_eq!(per_range, l.bytes_read);
        assert!(l.bytes_read >= l.bytes_requested);
    }

    #[test]
    fn aligns_and_covers() {
        let spans = [(4, 10_000), (10_004, 5_000), (100_000, 1)];
        let l = IoLayout::build(&spans, 200_001, A, 0, 1 << 20);
        check_invariants(&spans, 200_001, &l, 1 << 20);
        assert_eq!(l.ranges.len(), 2, "first two spans share a page and merge");
        assert_eq!(l.bytes_requested, 15_001);
        assert_eq!(l.ranges[0].file_offset, 0);
        assert_eq!(l.ranges[0].device_len, 16_384);
        assert_eq!(l.ranges[1].file_offset, 98_304);
    }

    #[test]
    fn merge_gap_knob() {
        let spans = [(0, 4096), (4096 * 3, 4096)];
        let tight = IoLayout::build(&spans, 1 << 20, A, 0, 1 << 20);
        assert_eq!(tight.ranges.len(), 2);
        let loose = IoLayout::build(&spans, 1 << 20, A, 8192, 1 << 20);
        assert_eq!(loose.ranges.len(), 1);
        assert_eq!(loose.over_read(), 8192);
        check_invariants(&spans, 1 << 20, &loose, 1 << 20);
        let just_short = IoLayout::build(&spans, 1 << 20, A, 8191, 1 << 20);
        assert_eq!(just_short.ranges.len(), 2);
    }

    #[test]
    fn splits_into_tasks() {
        let spans = [(100, 10 * 4096)];
        let l = IoLayout::build(&spans, 1 << 20, A, 0, 4 * 4096);
        assert_eq!(l.tasks.len(), 3);
        assert_eq!(l.tasks[0].len, 4 * 4096);
        assert_eq!(l.tasks[2].len, 3 * 4096);
        check_invariants(&spans, 1 << 20, &l, 4 * 4096);
    }

    #[test]
    fn clips_at_end_of_file() {
        let file_size = 10_000;
        let spans = [(4, 9_000)];
        let l = IoLayout::build(&spans, file_size, A, 0, 4096);
        check_invariants(&spans, file_size, &l, 4096);
        assert_eq!(l.ranges[0].read_len, 10_000);
        assert_eq!(l.ranges[0].device_len, 12_288);
        assert_eq!(l.tasks.last().unwrap().len, 10_000 - 8192);
    }

    #[test]
    fn unordered_and_overlapping_spans() {
        let spans = [(50_000, 100), (4, 30), (50_050, 200), (0, 0), (20_000, 4)];
        let l = IoLayout::build(&spans, 60_000, A, 0, 8192);
        check_invariants(&spans, 60_000, &l, 8192);
        assert_eq!(l.bytes_requested, 30 + 250 + 4);
    }

    #[test]
    fn pseudo_random_layouts_hold_invariants() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let file_size = 1 + next() % 5_000_000;
            let n = 1 + next() % 40;
            let mut spans = Vec::new();
            for _ in 0..n {
                let off = next() % file_size;
                let len = 1 + next() % (file_size - off).min(300_000);
                spans.push((off, len));
            }
            let gap = [0, 4096, 65536][(next() % 3) as usize];
            let task = A * (1 + next() % 64);
            let l = IoLayout::build(&spans, file_size, A, gap, task);
            check_invariants(&spans, file_size, &l, task);
        }
    }
}
