//! The compacted topic exactly-once Kafka sinks keep their offsets and
//! epoch markers in, read back after a transaction was aborted: what a
//! broker outage in the middle of a commit leaves at its end.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::common;

fn transactional(brokers: &str, id: &str) -> BaseProducer {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", id)
        .create()
        .expect("a transactional producer");
    p.init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    p
}

/// One transaction writing `key = value` to `topic`, committed or aborted.
fn write(p: &BaseProducer, topic: &str, key: &str, value: &str, commit: bool) {
    p.begin_transaction().expect("begin_transaction");
    p.send(BaseRecord::to(topic).key(key).payload(value))
        .map_err(|(e, _)| e)
        .expect("send");
    p.flush(Duration::from_secs(30)).expect("flush");
    if commit {
        p.commit_transaction(Duration::from_secs(30))
            .expect("commit_transaction");
    } else {
        p.abort_transaction(Duration::from_secs(30))
            .expect("abort_transaction");
    }
}

#[test]
fn an_aborted_transaction_at_the_end_of_the_offsets_topic_holds_nothing_back() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("offsets-aborted-end");
    common::kafka::create_topic(&brokers, &topic, 1);
    let id = common::unique_name("offsets-writer");
    let p = transactional(&brokers, &id);
    write(&p, &topic, "cp/src/0", "5", true);
    write(&p, &topic, "cp/src/0", "7", false);
    // A writer cut off mid-commit: its transaction is open until the next
    // writer with its id fences it, aborting it.
    p.begin_transaction().expect("begin_transaction");
    p.send(BaseRecord::to(&topic).key("cp/src/0").payload("9"))
        .map_err(|(e, _)| e)
        .expect("send");
    p.flush(Duration::from_secs(30)).expect("flush");
    let _next = transactional(&brokers, &id);
    let started = Instant::now();
    let read = skein_sinks::kafka::stored_offsets(&brokers, &topic, "cp", "src");
    assert_eq!(
        read.expect("the offsets read back"),
        [(0, 5)].into(),
        "the committed offset, not the aborted one"
    );
    // A read that waits is one held back: the log has no open transaction.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "read took {:?}",
        started.elapsed()
    );
}

#[test]
fn another_writers_open_transaction_is_waited_for_and_what_came_after_is_read() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("offsets-open-middle");
    common::kafka::create_topic(&brokers, &topic, 1);
    let open = transactional(&brokers, &common::unique_name("offsets-open"));
    open.begin_transaction().expect("begin_transaction");
    open.send(BaseRecord::to(&topic).key("cp/src/1").payload("3"))
        .map_err(|(e, _)| e)
        .expect("send");
    open.flush(Duration::from_secs(30)).expect("flush");
    // Committed after the open transaction began: past the last stable
    // offset until it ends, and still to be read.
    let later = transactional(&brokers, &common::unique_name("offsets-later"));
    write(&later, &topic, "cp/src/0", "5", true);
    let reader = {
        let (brokers, topic) = (brokers.clone(), topic.clone());
        std::thread::spawn(move || {
            skein_sinks::kafka::stored_offsets(&brokers, &topic, "cp", "src")
        })
    };
    open.commit_transaction(Duration::from_secs(30))
        .expect("commit_transaction");
    assert_eq!(
        reader
            .join()
            .expect("the reader")
            .expect("the offsets read back"),
        [(0, 5), (1, 3)].into()
    );
}
