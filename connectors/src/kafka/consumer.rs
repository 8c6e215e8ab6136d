//! A Kafka consumer read through librdkafka's batch API: what every Kafka
//! reader of Skein uses (the source's pull engine, YSB's recount and load
//! bench).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

/// Records taken from librdkafka's queue per call.
const BATCH: usize = 1024;

/// One item of a consumer's queue.
pub enum Fetched<'a> {
    Record {
        partition: i32,
        offset: i64,
        payload: &'a [u8],
    },
    /// A consumer error (broker down, partition error, ...).
    Error(RDKafkaErrorCode),
}

/// A [`BaseConsumer`] read through librdkafka's batch API
/// (`rd_kafka_consume_batch_queue`) rather than one `poll` per record: one
/// queue lock, clock read and FFI round trip per batch instead of per
/// record, which more than doubles what one thread drains (≈0.55 M to
/// ≈1.5 M YSB records/s on the 2-core development VM).
///
/// Only for consumers with assigned partitions (no group rebalancing, no
/// offset commits): those would come back through this queue as events the
/// batch API does not serve. librdkafka's log lines go to its own log
/// callback (stderr) instead of `tracing` while records are read this way.
pub struct BatchConsumer {
    /// A reference to the consumer's queue, released before the consumer.
    queue: *mut rd::rd_kafka_queue_t,
    /// Partitions read from queues of their own (see
    /// [`BatchConsumer::with_partition_queues`]), released like `queue`.
    partition_queues: BTreeMap<i32, *mut rd::rd_kafka_queue_t>,
    consumer: BaseConsumer,
}

// SAFETY: librdkafka queues are thread-safe; the pointer is only used
// through librdkafka's API and released once, in `drop`.
unsafe impl Send for BatchConsumer {}
unsafe impl Sync for BatchConsumer {}

impl BatchConsumer {
    pub fn new(consumer: BaseConsumer) -> Self {
        // SAFETY: the client pointer is valid while `consumer` lives, which
        // is longer than the queue reference (see `drop`).
        let queue = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        assert!(!queue.is_null(), "a BaseConsumer has a consumer queue");
        BatchConsumer {
            queue,
            partition_queues: BTreeMap::new(),
            consumer,
        }
    }

    /// A consumer whose `partitions` of `topic` each keep their records in
    /// a queue of their own, read with [`BatchConsumer::read_partition`].
    /// A pull can then take a fair share from every partition: on the
    /// shared queue, records sit in fetch order, and one fetch can bring a
    /// whole compressed backlog of one partition before any of the next.
    ///
    /// Must be called before the partitions are assigned: librdkafka keeps
    /// a queue whose forwarding the application set (even to none) as it
    /// is across assignments, and would otherwise forward it to the shared
    /// queue when fetching starts.
    pub fn with_partition_queues(
        consumer: BaseConsumer,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Self, String> {
        let mut this = BatchConsumer::new(consumer);
        let name = CString::new(topic).map_err(|_| format!("topic {topic:?} has a NUL byte"))?;
        for &p in partitions {
            // SAFETY: valid consumer handle and NUL-terminated topic; the
            // returned reference is released in `drop`.
            let queue = unsafe {
                rd::rd_kafka_queue_get_partition(
                    this.consumer.client().native_ptr(),
                    name.as_ptr(),
                    p,
                )
            };
            if queue.is_null() {
                return Err(format!("no queue for partition {p} of {topic}"));
            }
            // SAFETY: `queue` is valid; NULL removes its forwarding.
            unsafe { rd::rd_kafka_queue_forward(queue, std::ptr::null_mut()) };
            this.partition_queues.insert(p, queue);
        }
        Ok(this)
    }

    pub fn consumer(&self) -> &BaseConsumer {
        &self.consumer
    }

    /// The low and high watermarks of a partition as the last fetch
    /// response reported them (no request to the broker), if known.
    pub fn cached_watermarks(&self, topic: &str, partition: i32) -> Option<(i64, i64)> {
        let topic = std::ffi::CString::new(topic).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: valid client and NUL-terminated topic; librdkafka writes
        // the two offsets.
        let err = unsafe {
            rd::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        };
        (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && low >= 0 && high >= 0)
            .then_some((low, high))
    }

    /// Hand up to `max` queued items to `f`: waits up to `wait` for the
    /// first one, then takes only what is already queued. Returns how many
    /// items `f` saw.
    pub fn read(&self, wait: Duration, max: usize, f: impl FnMut(Fetched<'_>)) -> usize {
        // SAFETY: the consumer queue lives as long as `self`.
        unsafe { read_queue(self.queue, wait, max, f) }
    }

    /// [`BatchConsumer::read`] for one partition with a queue of its own;
    /// 0 for any other partition.
    pub fn read_partition(
        &self,
        partition: i32,
        wait: Duration,
        max: usize,
        f: impl FnMut(Fetched<'_>),
    ) -> usize {
        match self.partition_queues.get(&partition) {
            // SAFETY: the partition queue lives as long as `self`.
            Some(&queue) => unsafe { read_queue(queue, wait, max, f) },
            None => 0,
        }
    }
}

/// Reads up to `max` items of `queue` (see [`BatchConsumer::read`]).
///
/// # Safety
/// `queue` must be a valid librdkafka queue for the whole call.
unsafe fn read_queue(
    queue: *mut rd::rd_kafka_queue_t,
    wait: Duration,
    max: usize,
    mut f: impl FnMut(Fetched<'_>),
) -> usize {
    let mut slots: [*mut rd::rd_kafka_message_t; BATCH] = [std::ptr::null_mut(); BATCH];
    let max = max.clamp(1, BATCH);
    // The batch call waits until its batch is full or the time is up, so
    // ask for one record with a wait, then for the rest without.
    let wait_ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `slots` has room for the requested count; the queue is valid.
    let mut n = unsafe { rd::rd_kafka_consume_batch_queue(queue, 0, slots.as_mut_ptr(), max) };
    if n == 0 && wait_ms > 0 {
        n = unsafe { rd::rd_kafka_consume_batch_queue(queue, wait_ms, slots.as_mut_ptr(), 1) };
        if n == 1 && max > 1 {
            let more = unsafe {
                rd::rd_kafka_consume_batch_queue(queue, 0, slots.as_mut_ptr().add(1), max - 1)
            };
            n += more.max(0);
        }
    }
    let n = n.max(0) as usize;
    for &m in &slots[..n] {
        // SAFETY: librdkafka returned `n` valid messages; each is read,
        // then destroyed exactly once, and its payload is not used after.
        unsafe {
            let msg = &*m;
            if msg.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                let payload = if msg.payload.is_null() {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(msg.payload as *const u8, msg.len)
                };
                f(Fetched::Record {
                    partition: msg.partition,
                    offset: msg.offset,
                    payload,
                });
            } else {
                f(Fetched::Error(msg.err.into()));
            }
            rd::rd_kafka_message_destroy(m);
        }
    }
    n
}

impl Drop for BatchConsumer {
    fn drop(&mut self) {
        // SAFETY: the reference taken in `new`, released once, before the
        // consumer itself is dropped (fields drop after this); likewise
        // each partition queue.
        unsafe {
            for &queue in self.partition_queues.values() {
                rd::rd_kafka_queue_destroy(queue);
            }
            rd::rd_kafka_queue_destroy(self.queue);
        }
    }
}
