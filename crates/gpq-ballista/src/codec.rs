//! The extension codecs that carry gpq's nodes through Ballista's plans:
//! [`GpqLogicalCodec`] for [`GpqTable`]s in logical plans (client to
//! scheduler) and [`GpqPhysicalCodec`] for [`GpqScanExec`]s in stage plans
//! (scheduler to executors), alone or as the file groups of a
//! `DataSourceExec` that give each task its own partitions of a scan (see
//! the `scan_source` module). Each encodes its node with
//! `gpq_datafusion`'s `to_bytes` behind a tag, and hands everything else
//! (Ballista's shuffle readers and writers, file formats, functions) to the
//! codec it wraps, Ballista's own by default.
//!
//! The tags start with `G` (0x47). As the first byte of a protobuf message
//! that would be field 8 of wire type 7, and there is no wire type 7, so
//! bytes a protobuf codec (Ballista's, DataFusion's) wrote never start with
//! a tag: a buffer without one goes to the wrapped codec untouched.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, Extension, HigherOrderUDF, LogicalPlan, ScalarUDF, WindowUDF};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use gpq_datafusion::{GpqScanExec, GpqTable, ScanDevice};

use crate::scan_source::{file_groups_scan, scan_as_file_groups};

/// Marks a serialized [`GpqTable`] in the logical codec's bytes.
const TABLE_TAG: &[u8] = b"GPQ-TABLE\n";
/// Marks a serialized [`GpqScanExec`] in the physical codec's bytes.
const SCAN_TAG: &[u8] = b"GPQ-SCAN\n";
/// Marks a serialized gpq scan planned as file groups in the physical
/// codec's bytes: the scan partitions of each group (the number of groups,
/// then per group its number of partitions and each partition, all
/// little-endian `u32`s), the limit pushed into the file scan (a `u32` 0 for
/// none, else 1 and the limit as a little-endian `u64`), then the scan.
const FILE_GROUPS_TAG: &[u8] = b"GPQ-FILE-GROUPS\n";

/// A logical extension codec that encodes [`GpqTable`] providers (their
/// files, schema and options) and hands everything else to the codec it
/// wraps (Ballista's [`BallistaLogicalExtensionCodec`] unless told
/// otherwise).
///
/// Decoding a table opens its files and reads their footers again, so the
/// process that decodes (the scheduler) must see the files at the same paths.
/// A decoded table is [planned for executors](GpqTable::planned_for_executors):
/// the scheduler does not look for a GPU of its own, and each executor
/// resolves the backend where it decodes.
#[derive(Debug)]
pub struct GpqLogicalCodec {
    inner: Arc<dyn LogicalExtensionCodec>,
    encoded: AtomicUsize,
    decoded: AtomicUsize,
}

impl GpqLogicalCodec {
    /// gpq tables, and Ballista's logical codec for everything else.
    pub fn new() -> Self {
        Self::wrapping(Arc::new(BallistaLogicalExtensionCodec::default()))
    }

    /// gpq tables, and `inner` for everything else.
    pub fn wrapping(inner: Arc<dyn LogicalExtensionCodec>) -> Self {
        GpqLogicalCodec { inner, encoded: AtomicUsize::new(0), decoded: AtomicUsize::new(0) }
    }

    /// gpq tables this codec has encoded.
    pub fn tables_encoded(&self) -> usize {
        self.encoded.load(Ordering::Relaxed)
    }

    /// gpq tables this codec has decoded.
    pub fn tables_decoded(&self) -> usize {
        self.decoded.load(Ordering::Relaxed)
    }
}

impl Default for GpqLogicalCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl LogicalExtensionCodec for GpqLogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        let Some(bytes) = buf.strip_prefix(TABLE_TAG) else {
            return self.inner.try_decode_table_provider(buf, table_ref, schema, ctx);
        };
        let table = GpqTable::from_bytes(bytes)?.planned_for_executors();
        if table.schema().fields() != schema.fields() {
            return Err(DataFusionError::Plan(format!(
                "gpq table {table_ref}: the plan's schema {schema} is not the table's {}",
                table.schema()
            )));
        }
        self.decoded.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(table))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let Some(table) = node.downcast_ref::<GpqTable>() else {
            return self.inner.try_encode_table_provider(table_ref, node, buf);
        };
        let bytes = table.to_bytes()?;
        buf.extend_from_slice(TABLE_TAG);
        buf.extend_from_slice(&bytes);
        self.encoded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn try_decode_file_format(&self, buf: &[u8], ctx: &TaskContext) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(&self, buf: &mut Vec<u8>, node: Arc<dyn FileFormatFactory>) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(&self, name: &str, buf: &[u8]) -> Result<Arc<HigherOrderUDF>> {
        self.inner.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(&self, node: &HigherOrderUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}

/// A physical extension codec that encodes [`GpqScanExec`]s (their
/// partitions, columns, filters, limit and backend), alone or in the
/// file groups the scheduler plans them as (see [`GpqSchedulerPlanner`](crate::GpqSchedulerPlanner)), and hands everything
/// else to the codec it wraps (Ballista's [`BallistaPhysicalExtensionCodec`]
/// unless told otherwise).
///
/// Decoding a scan opens only the files its partitions read and reads their
/// footers; which row groups and rows each partition reads is what the
/// scheduler planned. The executors must see the files at the same paths.
/// Where a scan decodes is the decoding codec's [`ScanDevice`] (an
/// executor's GPU, or the CPU), resolved with the table's backend option.
#[derive(Debug)]
pub struct GpqPhysicalCodec {
    inner: Arc<dyn PhysicalExtensionCodec>,
    device: ScanDevice,
    /// Shared with the codecs made by [`GpqPhysicalCodec::on_device`].
    counts: Arc<ScanCounts>,
}

/// What physical codecs of one family encoded and decoded.
#[derive(Debug, Default)]
struct ScanCounts {
    encoded: AtomicUsize,
    decoded: AtomicUsize,
    decoded_on_gpu: AtomicUsize,
}

impl GpqPhysicalCodec {
    /// gpq scans, and Ballista's physical codec for everything else.
    pub fn new() -> Self {
        Self::wrapping(Arc::new(BallistaPhysicalExtensionCodec::default()))
    }

    /// gpq scans, and `inner` for everything else.
    pub fn wrapping(inner: Arc<dyn PhysicalExtensionCodec>) -> Self {
        GpqPhysicalCodec { inner, device: ScanDevice::AsOptions, counts: Arc::default() }
    }

    /// Scans this codec decodes run on `device` (an executor's GPU, or the
    /// CPU); by default as the tables' options say.
    pub fn with_scan_device(mut self, device: ScanDevice) -> Self {
        self.device = device;
        self
    }

    /// Where the scans this codec decodes run.
    pub fn scan_device(&self) -> ScanDevice {
        self.device
    }

    /// A codec like this one (the same wrapped codec, the same counters:
    /// the scans it encodes and decodes count in both) whose scans run on
    /// `device`.
    pub fn on_device(&self, device: ScanDevice) -> GpqPhysicalCodec {
        GpqPhysicalCodec { inner: Arc::clone(&self.inner), device, counts: Arc::clone(&self.counts) }
    }

    /// gpq scans (alone or as file groups) this codec has encoded.
    pub fn scans_encoded(&self) -> usize {
        self.counts.encoded.load(Ordering::Relaxed)
    }

    /// gpq scans (alone or as file groups) this codec has decoded.
    pub fn scans_decoded(&self) -> usize {
        self.counts.decoded.load(Ordering::Relaxed)
    }

    /// Of the decoded scans, those that decode on a GPU.
    pub fn scans_decoded_on_gpu(&self) -> usize {
        self.counts.decoded_on_gpu.load(Ordering::Relaxed)
    }

    /// Counts a decoded scan.
    fn decoded(&self, scan: &GpqScanExec) {
        self.counts.decoded.fetch_add(1, Ordering::Relaxed);
        if scan.uses_gpu() {
            self.counts.decoded_on_gpu.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Default for GpqPhysicalCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl PhysicalExtensionCodec for GpqPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(bytes) = buf.strip_prefix(SCAN_TAG) {
            if !inputs.is_empty() {
                return Err(DataFusionError::Plan(format!("a gpq scan has no inputs, {} were given", inputs.len())));
            }
            let scan = GpqScanExec::from_bytes_on(bytes, ctx, self.device)?;
            self.decoded(&scan);
            return Ok(Arc::new(scan));
        }
        if let Some(bytes) = buf.strip_prefix(FILE_GROUPS_TAG) {
            if !inputs.is_empty() {
                return Err(DataFusionError::Plan(format!("a gpq scan has no inputs, {} were given", inputs.len())));
            }
            let (groups, limit, bytes) = read_groups(bytes)?;
            let scan = GpqScanExec::from_bytes_on(bytes, ctx, self.device)?;
            self.decoded(&scan);
            return scan_as_file_groups(Arc::new(scan), Some(&groups), limit);
        }
        self.inner.try_decode(buf, inputs, ctx, proto_converter)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let (tag, bytes) = if let Some(scan) = node.downcast_ref::<GpqScanExec>() {
            (SCAN_TAG, scan.to_bytes()?)
        } else if let Some(found) = file_groups_scan(&node) {
            let found = found?;
            let mut bytes = write_groups(&found.groups, found.limit)?;
            bytes.extend_from_slice(&found.scan.to_bytes()?);
            (FILE_GROUPS_TAG, bytes)
        } else {
            return self.inner.try_encode(node, buf, proto_converter);
        };
        buf.extend_from_slice(tag);
        buf.extend_from_slice(&bytes);
        self.counts.encoded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(&self, name: &str, buf: &[u8]) -> Result<Arc<HigherOrderUDF>> {
        self.inner.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(&self, node: &HigherOrderUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn PhysicalExpr>],
        ctx: &PhysicalExprDecodeCtx<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.inner.try_decode_expr(buf, inputs, ctx)
    }

    fn try_encode_expr(&self, node: &Arc<dyn PhysicalExpr>, buf: &mut Vec<u8>, ctx: &PhysicalExprEncodeCtx<'_>) -> Result<()> {
        self.inner.try_encode_expr(node, buf, ctx)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}

/// `groups` of scan partitions and `limit` (see [`FILE_GROUPS_TAG`]).
fn write_groups(groups: &[Vec<usize>], limit: Option<usize>) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut put = |n: usize| -> Result<()> {
        let n = u32::try_from(n).map_err(|_| DataFusionError::Internal(format!("{n} does not fit a gpq plan's u32")))?;
        bytes.extend_from_slice(&n.to_le_bytes());
        Ok(())
    };
    put(groups.len())?;
    for group in groups {
        put(group.len())?;
        for &p in group {
            put(p)?;
        }
    }
    match limit {
        None => put(0)?,
        Some(limit) => {
            put(1)?;
            bytes.extend_from_slice(&(limit as u64).to_le_bytes());
        }
    }
    Ok(bytes)
}

/// The groups and limit [`write_groups`] wrote at the start of `bytes`, and the bytes after them.
fn read_groups(bytes: &[u8]) -> Result<(Vec<Vec<usize>>, Option<usize>, &[u8])> {
    let mut rest = bytes;
    let mut take = || -> Result<usize> {
        let (n, after) = rest.split_first_chunk::<4>().ok_or_else(|| DataFusionError::Plan("a gpq scan's file groups are truncated".into()))?;
        rest = after;
        Ok(u32::from_le_bytes(*n) as usize)
    };
    // Nothing is sized from a count: each value read needs its four bytes,
    // so a corrupt count ends in an error, not in an allocation.
    let groups = take()?;
    let mut out = Vec::new();
    for _ in 0..groups {
        let partitions = take()?;
        let mut group = Vec::new();
        for _ in 0..partitions {
            group.push(take()?);
        }
        out.push(group);
    }
    let limit = match take()? {
        0 => None,
        1 => {
            let (n, after) = rest.split_first_chunk::<8>().ok_or_else(|| DataFusionError::Plan("a gpq scan's limit is truncated".into()))?;
            rest = after;
            Some(usize::try_from(u64::from_le_bytes(*n)).map_err(|_| DataFusionError::Plan("a gpq scan's limit does not fit this machine".into()))?)
        }
        other => return Err(DataFusionError::Plan(format!("a gpq scan's limit flag is {other}, not 0 or 1"))),
    };
    Ok((out, limit, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_groups_round_trip_and_truncations_are_errors() {
        for (groups, limit) in [
            (vec![vec![0], vec![1], vec![2]], None),
            (vec![vec![3, 0], vec![]], Some(7)),
            (vec![], Some(usize::MAX >> 1)),
        ] {
            let mut bytes = write_groups(&groups, limit).unwrap();
            bytes.extend_from_slice(b"scan");
            let (g, l, rest) = read_groups(&bytes).unwrap();
            assert_eq!((g, l, rest), (groups.clone(), limit, &b"scan"[..]));
            // Every cut before the scan's bytes is an error, never a panic.
            for cut in 0..bytes.len() - 4 {
                assert!(read_groups(&bytes[..cut]).is_err(), "{groups:?} cut at {cut}");
            }
        }
        // A count that claims more than the bytes hold, and a bad limit flag.
        assert!(read_groups(&u32::MAX.to_le_bytes()).is_err());
        let mut bad_flag = write_groups(&[vec![0]], None).unwrap();
        let last = bad_flag.len() - 4;
        bad_flag[last] = 2;
        assert!(read_groups(&bad_flag).is_err());
    }
}
