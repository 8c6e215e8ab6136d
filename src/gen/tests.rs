use super::*;
use clap::Parser;

#[derive(Parser)]
struct Gen {
    #[command(flatten)]
    args: GenArgs,
}

fn event_rate_of(flags: &str) -> Result<u64> {
    let argv = format!("gen --to kinesis://s {flags}");
    event_rate(&Gen::try_parse_from(argv.split_whitespace())?.args)
}

#[test]
fn the_event_rate_defaults_to_the_rate_then_to_the_generator() {
    assert_eq!(event_rate_of("nexmark").unwrap(), 10_000);
    assert_eq!(event_rate_of("ysb").unwrap(), 100_000);
    assert_eq!(event_rate_of("ysb --rate 500").unwrap(), 500);
    assert_eq!(event_rate_of("ysb --rate 500 --event-rate 7").unwrap(), 7);
    for bad in ["nexmark --event-rate 0", "ysb --rate 2000000000"] {
        let err = event_rate_of(bad).unwrap_err().to_string();
        assert!(err.contains("--event-rate"), "{bad}: {err}");
    }
}

#[test]
fn the_chunk_being_filled_is_not_counted_as_lag() {
    // 100,000/s in chunks of 5,000: at 1.049 s, 104,900 events are due,
    // of which the 100,000 of twenty whole chunks must have been sent.
    assert_eq!(whole_chunks_due(1.049, 100_000, 5_000), 100_000);
    assert_eq!(whole_chunks_due(1.05, 100_000, 5_000), 105_000);
    assert_eq!(whole_chunks_due(0.5, 7, 0), 3);
}

#[test]
fn destinations_parse_or_say_what_is_expected() {
    assert_eq!(
        Destination::parse("kafka://127.0.0.1:9092,h:1/bids").unwrap(),
        Destination::Kafka {
            brokers: "127.0.0.1:9092,h:1".into(),
            topic: "bids".into()
        }
    );
    assert_eq!(
        Destination::parse("kinesis://s1").unwrap(),
        Destination::Kinesis {
            stream: "s1".into()
        }
    );
    for bad in [
        "kafka://host",
        "kafka:///t",
        "kinesis://",
        "s3://b/k",
        "kinesis://a/b",
    ] {
        let err = Destination::parse(bad).unwrap_err().to_string();
        assert!(
            err.contains("expected") || err.contains("takes"),
            "{bad}: {err}"
        );
    }
}
