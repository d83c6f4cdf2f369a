//! Running one partition of a scan.
//!
//! A producer on a blocking thread (tokio's blocking pool, or a plain thread
//! outside a runtime) reads and decodes the partition's row groups and sends
//! the results through a channel of capacity one, so it works on the next
//! read while the consumer drains the previous one: at most one message
//! waits in the channel and one is being built. The producer starts on the
//! first poll and stops when the stream is dropped or the limit is reached.
//! The consumer cuts what arrives into batches of the session's batch size
//! and enforces the limit exactly. A producer that fails or panics ends the
//! stream with an error; one that vanishes without saying it finished is an
//! error too, never a silently short result.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::physical_plan::metrics::BaselineMetrics;
use futures::Stream;
use tokio::sync::mpsc;

use crate::scan::{Message, PartitionScan, Sink};

/// The stream of one partition.
pub(crate) fn execute(
    scan: PartitionScan,
    baseline: BaselineMetrics,
) -> Result<SendableRecordBatchStream> {
    if scan.read_columns.is_empty() && scan.filter.is_none() {
        // No column is read (nor filtered on): the row counts come from the footers.
        let total = scan
            .units
            .iter()
            .try_fold(0usize, |acc, u| acc.checked_add(u.rows));
        let rows = match (total, scan.limit) {
            (Some(total), limit) => limit.map_or(total, |l| l.min(total)),
            (None, Some(limit)) => limit,
            (None, None) => {
                return Err(DataFusionError::Execution(
                    "gpq scan: the row counts in the footers add up to more than a usize holds"
                        .into(),
                ));
            }
        };
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = RecordBatch::try_new_with_options(Arc::clone(&scan.schema), vec![], &options)?;
        let pending = if rows > 0 {
            VecDeque::from([batch])
        } else {
            VecDeque::new()
        };
        return Ok(Box::pin(ScanStream {
            schema: Arc::clone(&scan.schema),
            rx: None,
            start: None,
            finished: true,
            pending,
            batch_size: scan.batch_size,
            remaining: None,
            baseline,
        }));
    }
    let (tx, rx) = mpsc::channel(1);
    let schema = Arc::clone(&scan.schema);
    let (batch_size, limit) = (scan.batch_size, scan.limit);
    let start: Box<dyn FnOnce() -> Result<()> + Send> = Box::new(move || spawn_producer(scan, tx));
    Ok(Box::pin(ScanStream {
        schema,
        rx: Some(rx),
        start: Some(start),
        finished: false,
        pending: VecDeque::new(),
        batch_size: batch_size.max(1),
        remaining: limit,
        baseline,
    }))
}

fn spawn_producer(scan: PartitionScan, tx: mpsc::Sender<Result<Message>>) -> Result<()> {
    let job = move || {
        let mut sink = Sink::new(tx.clone(), scan.limit, scan.metrics.send_wait_time.clone());
        let outcome = catch_unwind(AssertUnwindSafe(|| scan.decoder.produce(&scan, &mut sink)));
        let last = match outcome {
            Ok(Ok(())) => Ok(Message::Done),
            Ok(Err(e)) => Err(e),
            Err(panic) => {
                let what = gpq::error::panic_message(panic.as_ref());
                Err(DataFusionError::Execution(format!(
                    "gpq scan panicked: {what}"
                )))
            }
        };
        // The consumer may be gone; then nobody needs the outcome.
        let _ = tx.blocking_send(last);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn_blocking(job);
            Ok(())
        }
        Err(_) => std::thread::Builder::new()
            .name("gpq-scan".into())
            .spawn(job)
            .map(|_| ())
            .map_err(|e| {
                DataFusionError::Execution(format!("cannot start a gpq scan thread: {e}"))
            }),
    }
}

type Starter = Box<dyn FnOnce() -> Result<()> + Send>;

struct ScanStream {
    schema: SchemaRef,
    rx: Option<mpsc::Receiver<Result<Message>>>,
    start: Option<Starter>,
    finished: bool,
    pending: VecDeque<RecordBatch>,
    batch_size: usize,
    remaining: Option<usize>,
    baseline: BaselineMetrics,
}

impl ScanStream {
    /// The next batch of at most `batch_size` rows from what has arrived.
    fn take_pending(&mut self) -> Option<RecordBatch> {
        let front = self.pending.pop_front()?;
        let mut want = self.batch_size;
        if let Some(r) = self.remaining {
            want = want.min(r);
        }
        let out = if front.num_rows() > want {
            self.pending
                .push_front(front.slice(want, front.num_rows() - want));
            front.slice(0, want)
        } else {
            front
        };
        if let Some(r) = self.remaining.as_mut() {
            *r -= out.num_rows();
        }
        Some(out)
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            if self.remaining == Some(0) {
                self.stop();
                return Poll::Ready(None);
            }
            if let Some(batch) = self.take_pending() {
                return Poll::Ready(Some(Ok(batch)));
            }
            if self.finished {
                return Poll::Ready(None);
            }
            if let Some(start) = self.start.take()
                && let Err(e) = start()
            {
                self.stop();
                return Poll::Ready(Some(Err(e)));
            }
            let Some(rx) = self.rx.as_mut() else {
                return Poll::Ready(None);
            };
            match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(Message::Batches(b)))) => self.pending.extend(b),
                Poll::Ready(Some(Ok(Message::Done))) => self.stop(),
                Poll::Ready(Some(Err(e))) => {
                    self.stop();
                    self.pending.clear();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    self.stop();
                    return Poll::Ready(Some(Err(DataFusionError::Execution(
                        "gpq scan: the reader stopped without finishing its row groups".into(),
                    ))));
                }
            }
        }
    }

    /// Stops reading: the producer sees the closed channel and ends.
    fn stop(&mut self) {
        self.finished = true;
        self.rx = None;
    }
}

impl Stream for ScanStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let poll = self.poll_inner(cx);
        self.baseline.record_poll(poll)
    }
}

impl RecordBatchStream for ScanStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
