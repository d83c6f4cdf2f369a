//! The batch reader as an async stream.
//!
//! [`gpq::DeviceBatchReader`] is a blocking iterator: each `next` waits for
//! IO and the GPU. [`DeviceTableStream`] runs it on a thread of its own and
//! hands its batches to async code through a channel of one slot, so the
//! reader works on the next batch while the consumer holds the previous one
//! (and at most one finished batch waits in between, beside those the reader
//! decodes ahead). Dropping the stream stops the reader after the batch it
//! is on; a reader thread that dies without finishing ends the stream with
//! an error, never silently early.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use gpq::{DeviceBatchReader, DeviceTable, Error};
use tokio::sync::mpsc;

/// A [`Stream`] of the device tables a [`DeviceBatchReader`] reads, in
/// order; after an error it ends. Made by [`device_table_stream`].
pub struct DeviceTableStream {
    schema: arrow::datatypes::SchemaRef,
    batches: mpsc::Receiver<gpq::Result<DeviceTable>>,
    /// Whether the reader thread said it finished (its last message).
    finished: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: bool,
}

impl std::fmt::Debug for DeviceTableStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTableStream").field("done", &self.done).finish()
    }
}

/// Turns `reader` into an async [`Stream`] of its batches, read on a thread
/// of its own (no async runtime needed to make it; polled from any).
///
/// ```no_run
/// use futures::StreamExt;
/// use gpq::DeviceReaderBuilder;
///
/// # async fn run() -> gpq::Result<()> {
/// let reader = DeviceReaderBuilder::try_new("lineitem.parquet")?.with_device_memory_limit(1 << 30).build()?;
/// let mut batches = gpq_datafusion::device_table_stream(reader)?;
/// while let Some(table) = batches.next().await {
///     println!("{} rows on the GPU", table?.num_rows());
/// }
/// # Ok(())
/// # }
/// ```
pub fn device_table_stream(reader: DeviceBatchReader) -> gpq::Result<DeviceTableStream> {
    let schema = reader.schema().clone();
    let (tx, rx) = mpsc::channel(1);
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let said = finished.clone();
    std::thread::Builder::new()
        .name("gpq-batches".into())
        .spawn(move || {
            for batch in reader {
                // The consumer is gone: stop reading.
                if tx.blocking_send(batch).is_err() {
                    return;
                }
            }
            said.store(true, std::sync::atomic::Ordering::Release);
        })
        .map_err(|e| Error::Internal(format!("no thread for the batch reader: {e}")))?;
    Ok(DeviceTableStream { schema, batches: rx, finished, done: false })
}

impl DeviceTableStream {
    /// The schema of every batch.
    pub fn schema(&self) -> &arrow::datatypes::SchemaRef {
        &self.schema
    }
}

impl Stream for DeviceTableStream {
    type Item = gpq::Result<DeviceTable>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.batches.poll_recv(cx) {
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(Some(ok)) => Poll::Ready(Some(ok)),
            Poll::Ready(None) => {
                self.done = true;
                // The sender is dropped either way; only a finished reader set the flag first.
                if self.finished.load(std::sync::atomic::Ordering::Acquire) {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(Error::Internal("the batch reader's thread ended before its last batch".into()))))
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
