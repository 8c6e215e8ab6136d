use super::*;
use crate::recorded::Recorded;

fn config(url: &str) -> RegistryConfig {
    RegistryConfig {
        url: url.to_string(),
        user_info: Some("skein:secret".into()),
        ca: None,
        client_cert: None,
        verify: true,
    }
}

const USER: &str =
    r#"{\"type\":\"record\",\"name\":\"User\",\"fields\":[{\"name\":\"id\",\"type\":\"long\"}]}"#;

#[test]
fn schemas_by_id_latest_and_register_against_recorded_answers() {
    let by_id = format!(r#"{{"schema":"{USER}"}}"#);
    let latest = format!(r#"{{"subject":"users-value","version":3,"id":7,"schema":"{USER}"}}"#);
    let proto = r#"{"schemaType":"PROTOBUF","schema":"syntax = \"proto3\";"}"#;
    let server = Recorded::start(&[
        ("GET /schemas/ids/1", 200, &by_id),
        ("GET /schemas/ids/2", 200, proto),
        ("GET /subjects/users-value/versions/latest", 200, &latest),
        ("POST /subjects/out-value/versions", 200, r#"{"id":12}"#),
    ]);
    let r = Registry::new(config(&server.url)).unwrap();
    match r.schema_by_id(1) {
        ById::Found(s) => {
            assert_eq!(s.schema_type, SchemaType::Avro);
            assert!(s.schema.contains("\"User\""), "{}", s.schema);
        }
        other => panic!("{other:?}"),
    }
    match r.schema_by_id(2) {
        ById::Found(s) => assert_eq!(s.schema_type, SchemaType::Protobuf),
        other => panic!("{other:?}"),
    }
    match r.schema_by_id(9) {
        ById::Missing(why) => assert!(why.contains("HTTP 404") && why.contains("40403"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Cached: a second lookup asks nothing.
    let asked = server.requests.lock().unwrap().len();
    r.schema_by_id(1);
    assert_eq!(server.requests.lock().unwrap().len(), asked);

    let l = r.latest("users-value").unwrap();
    assert_eq!((l.id, l.schema_type), (7, SchemaType::Avro));
    let err = r.latest("nobody-value").unwrap_err().to_string();
    assert!(err.contains("nobody-value") && err.contains("404"), "{err}");

    assert_eq!(
        r.register("out-value", SchemaType::Protobuf, "syntax")
            .unwrap(),
        12
    );
    let requests = server.requests.lock().unwrap();
    let post = requests.iter().find(|q| q.method == "POST").unwrap();
    let body: serde_json::Value = serde_json::from_str(&post.body).unwrap();
    assert_eq!(body["schemaType"], "PROTOBUF");
    assert_eq!(body["schema"], "syntax");
    // Basic auth on every call: base64("skein:secret").
    assert!(
        requests
            .iter()
            .all(|q| q.authorization.as_deref() == Some("Basic c2tlaW46c2VjcmV0")),
        "{requests:?}"
    );
    assert_eq!(r.health(), Health::default());
}

#[test]
fn a_registry_that_is_down_is_retried_until_it_answers() {
    // A port that nothing listens on yet.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let r = Arc::new(Registry::new(config(&format!("http://{addr}"))).unwrap());
    assert!(r.probe().unwrap().contains("no answer"));
    let lookup = {
        let r = r.clone();
        std::thread::spawn(move || r.schema_by_id(1))
    };
    // Wait until the lookup has failed a few times, then bring it up.
    let t0 = Instant::now();
    while r.health().failures < 3 {
        assert!(t0.elapsed() < Duration::from_secs(30), "no retries seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let health = r.health();
    assert!(health.down_since_ms.is_some());
    assert!(
        health.last_error.unwrap().contains("onnect"),
        "a connection error"
    );
    let by_id = format!(r#"{{"schema":"{USER}"}}"#);
    let _server = Recorded::serve(
        std::net::TcpListener::bind(addr).unwrap(),
        &[("GET /schemas/ids/1", 200, &by_id)],
    );
    match lookup.join().unwrap() {
        ById::Found(s) => assert_eq!(s.id, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.health(), Health::default());
    assert!(r.probe().is_none());
}

#[test]
fn options_name_what_is_wrong() {
    let opts = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(RegistryConfig::from_options(&opts(&[])).unwrap(), None);
    let c = RegistryConfig::from_options(&opts(&[
        ("schema.registry.url", "https://r:8081/"),
        ("schema.registry.ssl.verify", "false"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((c.url.as_str(), c.verify), ("https://r:8081", false));
    for (pairs, needle) in [
        (vec![("schema.registry.url", "r:8081")], "http://"),
        (
            vec![
                ("schema.registry.url", "http://r"),
                ("schema.registry.basic.auth.user.info", "nopassword"),
            ],
            "user:password",
        ),
        (
            vec![
                ("schema.registry.url", "http://r"),
                ("schema.registry.ssl.key.location", "k.pem"),
            ],
            "go together",
        ),
    ] {
        let err = RegistryConfig::from_options(&opts(&pairs))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{err}");
    }
    let missing_ca = RegistryConfig::from_options(&opts(&[
        ("schema.registry.url", "https://r"),
        ("schema.registry.ssl.ca.location", "/nonexistent/ca.pem"),
    ]))
    .unwrap()
    .unwrap();
    let err = Registry::new(missing_ca).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}
