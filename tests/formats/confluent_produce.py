"""Writes Kafka topics with the Confluent client serializers (confluent-kafka's
AvroSerializer and ProtobufSerializer), as real producers write them, for
tests/formats.rs. Run with the venv scripts/setup.sh makes.

    confluent_produce.py nexmark BROKERS FROM TO FORMAT SCHEMA_DIR
        Reads the JSON topics FROM-{person,auction,bid} (as `skein gen nexmark`
        writes them) to their end and writes each record to TO-{table} in FORMAT
        (avro or protobuf). Writes the schemas it used to SCHEMA_DIR:
        {table}.avsc, or nexmark.desc (a descriptor set, as protoc writes one).

    confluent_produce.py records BROKERS TOPIC SCHEMA_FILE [REGISTRY_OUT]
        Writes JSON lines from stdin to TOPIC as Avro with the schema in
        SCHEMA_FILE; a line {"raw_hex": "..."} is written as those bytes, a line
        {"tombstone": true} as a record without a value, a line
        {"schema": "FILE"} makes FILE the schema of the lines after it (the
        subject's next version). With REGISTRY_OUT, writes there what the
        registry holds for the ids written: {"ID": "SCHEMA", ...}.

The serializers' registry is confluent-kafka's in-memory one (mock://): no
registry server is installed here (see docs/formats.md). The bytes are the
Confluent wire format all the same: magic byte, schema id, message indexes
(Protobuf), record.
"""

import json
import os
import sys

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

TABLES = {
    "person": [
        ("id", "long"), ("name", "string"), ("email_address", "string"),
        ("credit_card", "string"), ("city", "string"), ("state", "string"),
        ("date_time", "ts"), ("extra", "string"),
    ],
    "auction": [
        ("id", "long"), ("item_name", "string"), ("description", "string"),
        ("initial_bid", "long"), ("reserve", "long"), ("date_time", "ts"),
        ("expires", "ts"), ("seller", "long"), ("category", "long"), ("extra", "string"),
    ],
    "bid": [
        ("auction", "long"), ("bidder", "long"), ("price", "long"), ("channel", "string"),
        ("url", "string"), ("date_time", "ts"), ("extra", "string"),
    ],
}


def registry():
    return SchemaRegistryClient.new_client({"url": "mock://skein-tests"})


def avro_schema(table):
    fields = []
    for name, kind in TABLES[table]:
        t = {"type": "long", "logicalType": "timestamp-millis"} if kind == "ts" else kind
        fields.append({"name": name, "type": t})
    return json.dumps({"type": "record", "name": table.capitalize(), "namespace": "nexmark",
                       "fields": fields})


def proto_classes(schema_dir):
    """The NEXMark messages, built from descriptors (no protoc here): date_time
    as a google.protobuf.Timestamp, other times as int64 milliseconds."""
    f = descriptor_pb2.FileDescriptorProto(name="nexmark.proto", package="nexmark",
                                           syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    kinds = {"long": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
             "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING}
    for table, fields in TABLES.items():
        m = f.message_type.add(name=table.capitalize())
        for number, (name, kind) in enumerate(fields, start=1):
            field = m.field.add(name=name, number=number,
                                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if name == "date_time":
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                field.type_name = ".google.protobuf.Timestamp"
            else:
                field.type = kinds.get(kind, descriptor_pb2.FieldDescriptorProto.TYPE_INT64)
    ts = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(ts)
    with open(os.path.join(schema_dir, "nexmark.desc"), "wb") as out:
        out.write(descriptor_pb2.FileDescriptorSet(file=[ts, f]).SerializeToString())
    pool = descriptor_pool.Default()
    pool.Add(f)
    return {t: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "nexmark." + t.capitalize())) for t in TABLES}


def read_topic(brokers, topic):
    """Every record of a topic as (partition, value), each partition in order,
    and the topic's partition count."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "skein-tests-" + topic,
                  "enable.auto.commit": False})
    partitions = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
    out = []
    for p in partitions:
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        c.assign([TopicPartition(topic, p, low)])
        got = 0
        while got < high - low:
            m = c.poll(10)
            if m is None:
                raise SystemExit(f"{topic}/{p}: only {got} of {high - low} records came")
            if m.error():
                raise SystemExit(f"{topic}/{p}: {m.error()}")
            out.append((p, m.value()))
            got += 1
    c.close()
    return out, len(partitions)


def create_topic(brokers, topic, partitions):
    admin = AdminClient({"bootstrap.servers": brokers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(30)


def produce(brokers, topic, values):
    """Writes (partition, value) pairs, each partition in the given order."""
    p = Producer({"bootstrap.servers": brokers, "linger.ms": 20, "enable.idempotence": True})
    for partition, v in values:
        while True:
            try:
                p.produce(topic, value=v, partition=partition)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    if p.flush(60) != 0:
        raise SystemExit(f"{topic}: records left undelivered")


def nexmark(brokers, source, dest, fmt, schema_dir):
    client = registry()
    classes = proto_classes(schema_dir) if fmt == "protobuf" else None
    for table, fields in TABLES.items():
        ctx = SerializationContext(f"{dest}-{table}", MessageField.VALUE)
        if fmt == "avro":
            schema = avro_schema(table)
            with open(os.path.join(schema_dir, f"{table}.avsc"), "w") as out:
                out.write(schema)
            serialize = AvroSerializer(client, schema)
        else:
            cls = classes[table]
            proto = ProtobufSerializer(cls, client, {"use.deprecated.format": False})

            def serialize(record, ctx, cls=cls, proto=proto):
                msg = cls()
                for name, _ in fields:
                    if name == "date_time":
                        ms = record[name]
                        msg.date_time.seconds, msg.date_time.nanos = ms // 1000, ms % 1000 * 1000000
                    else:
                        setattr(msg, name, record[name])
                return proto(msg, ctx)
        read, partitions = read_topic(brokers, f"{source}-{table}")
        create_topic(brokers, f"{dest}-{table}", partitions)
        values = [(p, serialize(json.loads(v), ctx)) for p, v in read]
        produce(brokers, f"{dest}-{table}", values)
        print(f"{dest}-{table}: {len(values)} records", file=sys.stderr)


def records(brokers, topic, schema_file, registry_out=None):
    client = registry()

    def serializer(path):
        with open(path) as f:
            return AvroSerializer(client, f.read())

    serialize = serializer(schema_file)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = []
    ids = set()
    for line in sys.stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        if "raw_hex" in r:
            values.append((0, bytes.fromhex(r["raw_hex"])))
        elif r.get("tombstone"):
            values.append((0, None))
        elif "schema" in r:
            serialize = serializer(r["schema"])
        else:
            value = serialize(r, ctx)
            ids.add(int.from_bytes(value[1:5], "big"))
            values.append((0, value))
    produce(brokers, topic, values)
    if registry_out:
        with open(registry_out, "w") as f:
            json.dump({str(i): client.get_schema(i).schema_str for i in sorted(ids)}, f)


if __name__ == "__main__":
    if sys.argv[1:2] == ["nexmark"] and len(sys.argv) == 7:
        nexmark(*sys.argv[2:])
    elif sys.argv[1:2] == ["records"] and len(sys.argv) in (5, 6):
        records(*sys.argv[2:])
    else:
        raise SystemExit(__doc__)
