//! Kafka smoke test: rdkafka produces to and consumes from every partition of
//! a fresh 4-partition topic on the real broker.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 4;
const PER_PARTITION: i32 = 25;

#[tokio::test]
async fn kafka_round_trip_on_four_partitions() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("skein-smoke");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = common::within(
        30,
        "creating the topic",
        admin.create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &options,
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("create_topics on {brokers}: {e} ({})", common::START_HINT));
    for result in created {
        result.unwrap_or_else(|(name, code)| panic!("creating topic {name}: {code}"));
    }

    // Produce to each partition explicitly, so all four are exercised.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("message.timeout.ms", "20000")
        .create()
        .expect("producer");
    let mut sent = BTreeMap::new();
    for partition in 0..PARTITIONS {
        for i in 0..PER_PARTITION {
            let key = format!("k-{partition}-{i}");
            let value = format!("{{\"partition\":{partition},\"seq\":{i}}}");
            let delivery = common::within(
                30,
                "delivering a record",
                producer.send(
                    FutureRecord::to(&topic)
                        .partition(partition)
                        .key(&key)
                        .payload(&value),
                    Duration::from_secs(10),
                ),
            )
            .await
            .unwrap_or_else(|(e, _)| panic!("producing to {topic}/{partition}: {e}"));
            assert_eq!(delivery.partition, partition);
            sent.insert(key, (partition, value));
        }
    }

    // Read every partition from the start; assign() needs no group rebalance.
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", common::unique_name("skein-smoke-group"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(&topic, partition, Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign partitions");

    let mut received = BTreeMap::new();
    common::within(60, "consuming the records back", async {
        while received.len() < sent.len() {
            let message = consumer.recv().await.expect("consuming");
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
            received.insert(key, (message.partition(), value));
        }
    })
    .await;
    assert_eq!(
        received, sent,
        "records read back differ from those written"
    );

    let deleted = admin.delete_topics(&[&topic], &options).await;
    if let Err(e) = deleted {
        eprintln!("note: could not delete topic {topic}: {e}");
    }
}
