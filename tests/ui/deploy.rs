//! From a topic to a running query in the editor: the page lists the
//! cluster's topics, samples one, declares its table from the sample,
//! explains a windowed and an updating query over it, previews the
//! updating one (its counts equal counts made here from the records
//! produced), and deploys it under a name; the query list then shows it
//! running under that name, though it has no checkpoint store (it prints
//! its rows). The same deploy on Lambda (ministack), whose functions are
//! tagged with the query's code and name.

use std::collections::BTreeMap;

use super::*;

/// Kills the queries the page started under `root` (those without a
/// checkpoint store say where they run), whatever the test's outcome.
struct StartedUnder(std::path::PathBuf);

impl Drop for StartedUnder {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.0.join(".running")) else {
            return;
        };
        for e in entries.flatten() {
            let stem = e
                .path()
                .file_stem()
                .map(|s| s.to_string_lossy().to_string());
            if let Some(pid) = stem.filter(|s| s.parse::<u32>().is_ok()) {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
    }
}

/// The rows of a table on the page, as text cells.
fn cells(id: &str) -> String {
    format!(
        "const rows = [...document.querySelectorAll('#{id} tbody tr')]\
         .map(tr => [...tr.children].map(td => td.textContent)); return rows.length ? rows : null;"
    )
}

/// Click an element by id.
fn click(browser: &Browser, id: &str) {
    browser.eval(&format!(
        "document.getElementById('{id}').click(); return true;"
    ));
}

/// Set the editor's SQL and explain it: the modes of the stages shown.
fn explained_modes(browser: &Browser, sql: &str) -> Vec<String> {
    let sql = serde_json::to_string(sql).unwrap();
    browser.eval(&format!(
        "document.getElementById('plan').innerHTML = ''; \
         document.getElementById('sql').value = {sql}; \
         document.getElementById('explain').click(); return true;"
    ));
    let rows: Vec<Vec<String>> =
        serde_json::from_value(browser.wait_for(60, "the plan's stages", &cells("plan-stages")))
            .unwrap();
    rows.into_iter().map(|r| r[2].clone()).collect()
}

#[test]
fn a_topic_becomes_a_named_query_deployed_from_the_editor() {
    let work = std::env::temp_dir().join(common::unique_name("skein-ui-deploy"));
    let root = work.join("checkpoints");
    std::fs::create_dir_all(&root).unwrap();
    let _started = StartedUnder(root.clone());
    let brokers = common::require_kafka();
    let topic = common::unique_name("clicks");
    common::kafka::create_topic(&brokers, &topic, 2);
    let (records, _) = windowed::records(400, 2, 40_000);
    windowed::produce(&topic, &records);
    let mut per_key: BTreeMap<String, i64> = BTreeMap::new();
    for (_, json) in &records {
        let v: Value = serde_json::from_str(json).unwrap();
        *per_key.entry(v["k"].as_str().unwrap().into()).or_default() += 1;
    }
    let (_ui, port) = start_ui_with(&root, None, &["--kafka", &brokers]);

    // The API: the topic, its two partitions and the records it holds.
    let listed = wait_json(port, "/api/sources", 60, "the topic listed", |v| {
        v["clusters"][0]["streams"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == topic.as_str())
            .cloned()
    });
    assert_eq!(
        listed["partitions"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    assert_eq!(listed["records"], 400, "{listed}");
    let (status, body) = http(
        port,
        "POST",
        "/api/sources/sample",
        Some(&serde_json::json!({"cluster": 0, "stream": "no-such-topic"})),
    );
    assert!(status >= 400 && !body.contains('\n'), "{status} {body}");

    // The page: sample the topic and declare its table.
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{port}/#/editor"));
    browser.wait_for(
        60,
        "the topic's sample button",
        &format!("return !!document.querySelector('button.sample[data-stream=\"{topic}\"]')"),
    );
    browser.eval(&format!(
        "document.querySelector('button.sample[data-stream=\"{topic}\"]').click(); return true;"
    ));
    let columns: Vec<Vec<String>> = serde_json::from_value(browser.wait_for(
        60,
        "the sample's columns",
        &cells("sample-columns"),
    ))
    .unwrap();
    let columns: Vec<(String, String)> = columns
        .into_iter()
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect();
    assert_eq!(
        columns,
        [("k", "VARCHAR"), ("ts", "TIMESTAMP"), ("v", "BIGINT")]
            .map(|(a, b)| (a.to_string(), b.to_string())),
        "the columns the JSON decoder reads"
    );
    let sampled: Vec<Vec<String>> =
        serde_json::from_value(browser.eval(&cells("sample-records"))).unwrap();
    assert_eq!(sampled.len(), 10, "the newest ten records");
    assert_eq!(
        browser.eval("return document.getElementById('sample-format').textContent"),
        "json"
    );
    click(&browser, "declare");
    let declared = browser
        .eval("return document.getElementById('sql').value")
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    assert!(declared.starts_with("CREATE EXTERNAL TABLE"), "{declared}");
    assert!(
        declared.contains(&format!("LOCATION '{topic}'")),
        "{declared}"
    );
    assert!(declared.contains("'event_time' 'ts'"), "{declared}");
    let table = declared["CREATE EXTERNAL TABLE ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    browser.screenshot(&screenshot_dir().join("editor-sources.png"));

    // A windowed and an updating query over it, explained.
    let windowed_sql = format!(
        "{declared}\nSELECT tumble(ts, INTERVAL '1' SECOND) AS w, k, count(*) AS n FROM {table} \
         GROUP BY tumble(ts, INTERVAL '1' SECOND), k;"
    );
    assert!(
        explained_modes(&browser, &windowed_sql).contains(&"accumulate".to_string()),
        "a windowed stage accumulates until its windows close"
    );
    let updating = format!("{declared}\nSELECT k, count(*) AS n FROM {table} GROUP BY k;");
    assert!(
        explained_modes(&browser, &updating).contains(&"updating".to_string()),
        "an updating stage"
    );

    // Previewed from the earliest records: the declared table reads them all.
    browser.eval(
        "document.getElementById('preview-from').value = 'earliest'; \
         document.getElementById('preview-rows').value = '10000'; \
         document.getElementById('preview-seconds').value = '300'; \
         document.getElementById('preview').click(); return true;",
    );
    wait_preview_total(
        &browser,
        per_key.values().sum::<i64>(),
        "every record counted",
    );
    let shown: Vec<(String, i64)> =
        serde_json::from_value(browser.eval(PREVIEW_COUNTS)).expect("preview rows");
    assert_eq!(shown.into_iter().collect::<BTreeMap<_, _>>(), per_key);
    click(&browser, "stop-preview");

    // A preview from a time reads only the records produced after it.
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let from = now_ms() + 1;
    while now_ms() <= from {
        std::thread::yield_now();
    }
    let later: Vec<(usize, String)> = (0..100)
        .map(|i| {
            let json = format!(
                r#"{{"k":"later","v":{},"ts":{}}}"#,
                1000 + i,
                1_700_000_100_000i64 + i
            );
            (i as usize % 2, json)
        })
        .collect();
    windowed::produce(&topic, &later);
    let (status, body) = http(
        port,
        "POST",
        "/api/preview",
        Some(&serde_json::json!({
            "sql": format!("{declared}\nSELECT k, v FROM {table};"),
            "from": from.to_string(), "rows": 100, "seconds": 120,
        })),
    );
    assert_eq!(status, 200, "{body}");
    let read: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "rows")
        .flat_map(|e| e["rows"].as_array().unwrap().clone())
        .map(|r| r["row"].clone())
        .collect();
    assert_eq!(read.len(), 100, "{body}");
    let ended: Value = body
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "ended")
        .expect("an ended event");
    assert!(
        ended["usd_per_million_events"]
            .as_f64()
            .is_some_and(|p| p > 0.0)
            && ended["invocations"].as_u64().is_some_and(|n| n > 0),
        "a price from what the preview used: {ended}"
    );
    assert!(
        read.iter().all(|r| r["k"] == "later"),
        "only the records after {from}: {body}"
    );

    // Deploy under a name, after a confirmation.
    let name = common::unique_name("clicks-per-key");
    browser.eval(&format!(
        "document.getElementById('deploy-name').value = '{name}'; \
         document.getElementById('deploy-backend').value = 'local'; \
         document.getElementById('group-size').value = '2'; return true;"
    ));
    click(&browser, "deploy");
    browser.wait_for(
        10,
        "the confirmation",
        "return document.getElementById('deploy-confirm').hidden === false",
    );
    assert!(
        root.read_dir()
            .unwrap()
            .all(|e| e.unwrap().file_name() != ".running"),
        "nothing starts before the confirmation"
    );
    click(&browser, "deploy-yes");
    let hash = browser.wait_for(
        90,
        "the deployed query's page",
        "return location.hash.startsWith('#/q/local/') ? location.hash : null",
    );
    let id = hash
        .as_str()
        .unwrap()
        .trim_start_matches("#/q/")
        .to_string();
    browser.goto(&format!("http://127.0.0.1:{port}/#/"));
    let row = browser.wait_for(
        60,
        "the query running under its name in the list",
        &format!(
            "const r = document.querySelector('tr.query[data-id=\"{id}\"]'); \
             return r && r.dataset.state === 'running' ? r.querySelector('.name')?.textContent : null;"
        ),
    );
    assert_eq!(row, name.as_str());
    browser.screenshot(&screenshot_dir().join("queries-deployed.png"));
    let listed = get_json(port, "/api/queries");
    let q = listed["queries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["id"] == id.as_str())
        .expect("listed")
        .clone();
    assert_eq!(q["name"], name.as_str(), "{q}");
    assert!(
        q["location"]
            .as_str()
            .unwrap()
            .contains("no checkpoint store"),
        "it prints its rows, and still shows: {q}"
    );

    // The name is the running query's: another query may not take it.
    let other = format!("{declared}\nSELECT v, count(*) AS n FROM {table} GROUP BY v;");
    let (status, body) = http(
        port,
        "POST",
        "/api/queries",
        Some(&serde_json::json!({"sql": other, "name": name, "confirmed": true})),
    );
    assert_eq!(status, 409, "{body}");

    // Stopped from its page: SIGTERM, and it leaves the list.
    browser.goto(&format!("http://127.0.0.1:{port}/#/q/{id}"));
    browser.wait_for(
        30,
        "a stop button",
        "return !!document.getElementById('stop')",
    );
    click(&browser, "stop");
    browser.accept_dialog();
    wait_json(port, "/api/queries", 60, "the query gone", |v| {
        (!v["queries"]
            .as_array()?
            .iter()
            .any(|q| q["id"] == id.as_str()))
        .then_some(Value::Null)
    });
    let log = std::fs::read_to_string(root.join(".queries").join(format!("{name}.log"))).unwrap();
    assert!(log.contains("stopped by a signal"), "{log}");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn the_editor_deploys_a_named_query_on_lambda() {
    common::require_aws();
    let work = std::env::temp_dir().join(common::unique_name("skein-ui-deploy-lambda"));
    std::fs::create_dir_all(&work).unwrap();
    let (_, source) = windowed::empty_kafka_table(PARTITIONS, 300);
    let (_, sink) = windowed::kafka_sink();
    let sql = windowed::query(&source, &sink);
    let store = format!("s3://{}", common::unique_name("skein-ui-deploy"));
    // A Kinesis stream of two shards with JSON records, for the topics panel.
    let stream = common::unique_name("ui-stream");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        common::create_stream(&stream, 2).await;
        let kinesis = aws_sdk_kinesis::Client::new(&common::aws_sdk_config().await);
        let entries = (0..50)
            .map(|i| {
                aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                    .partition_key(format!("p{i}"))
                    .data(aws_sdk_kinesis::primitives::Blob::new(format!(
                        r#"{{"user":"u{}","amount":{}.5,"at":{}}}"#,
                        i % 5,
                        i,
                        1_700_000_000_000i64 + i
                    )))
                    .build()
                    .unwrap()
            })
            .collect();
        common::put_records(&kinesis, &stream, entries).await;
    });
    let (_ui, port) = start_ui(&work.join("none"), Some(&store));
    let name = common::unique_name("windows");

    // The endpoint's Kinesis streams are listed, and one sampled.
    let (cluster, listed) = wait_json(port, "/api/sources", 60, "the stream listed", |v| {
        let c = v["clusters"]
            .as_array()?
            .iter()
            .find(|c| c["kind"] == "KINESIS")?
            .clone();
        let s = c["streams"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == stream.as_str())?
            .clone();
        Some(Value::Array(vec![c["cluster"].clone(), s]))
    })
    .as_array()
    .map(|a| (a[0].clone(), a[1].clone()))
    .unwrap();
    assert_eq!(
        listed["partitions"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    let (status, body) = http(
        port,
        "POST",
        "/api/sources/sample",
        Some(&serde_json::json!({"cluster": cluster, "stream": stream, "records": 10})),
    );
    assert_eq!(status, 200, "{body}");
    let sample: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        sample["sample"]["records"].as_array().map(Vec::len),
        Some(10),
        "{sample}"
    );
    assert_eq!(sample["sample"]["format"], "json", "{sample}");
    let columns: Vec<(String, String)> = sample["sample"]["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().into(),
                c["sql_type"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("amount", "DOUBLE"),
            ("at", "TIMESTAMP"),
            ("user", "VARCHAR")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let declaration = sample["declaration"].as_str().unwrap();
    assert!(declaration.contains("STORED AS KINESIS"), "{declaration}");
    // What it declares plans.
    let (status, body) = http(
        port,
        "POST",
        "/api/explain",
        Some(
            &serde_json::json!({"sql": format!("{declaration}\nSELECT user, sum(amount) FROM {} GROUP BY user;", sample["table"].as_str().unwrap())}),
        ),
    );
    assert_eq!(status, 200, "{body}");

    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{port}/#/editor"));
    browser.wait_for(30, "the editor", "return !!document.getElementById('sql')");
    let text = serde_json::to_string(&sql).unwrap();
    browser.eval(&format!(
        "document.getElementById('sql').value = {text}; \
         document.getElementById('deploy-name').value = '{name}'; \
         document.getElementById('deploy-backend').value = 'lambda'; \
         document.getElementById('group-size').value = '2'; return true;"
    ));
    click(&browser, "deploy");
    click(&browser, "deploy-yes");
    let hash = browser.wait_for(
        600,
        "the deployed query's page",
        "const e = document.getElementById('editor-error'); \
         if (e && !e.hidden) return 'error: ' + e.textContent; \
         return location.hash.startsWith('#/q/lambda/') ? location.hash : null",
    );
    let hash = hash.as_str().unwrap().to_string();
    assert!(hash.starts_with("#/q/lambda/"), "{hash}");
    let code = hash.trim_start_matches("#/q/lambda/").to_string();
    let row = wait_json(port, "/api/queries", 120, "the query listed", |v| {
        v["queries"]
            .as_array()?
            .iter()
            .find(|q| q["id"] == format!("lambda/{code}").as_str())
            .cloned()
    });
    assert_eq!(row["name"], name.as_str(), "{row}");

    // Its functions carry its code and name as tags.
    let tags = runtime.block_on(async {
        let lambda = aws_sdk_lambda::Client::new(&common::aws_sdk_config().await);
        let mut marker: Option<String> = None;
        let arn = loop {
            let page = lambda
                .list_functions()
                .set_marker(marker.clone())
                .send()
                .await
                .expect("ListFunctions");
            let found = page
                .functions()
                .iter()
                .find(|f| f.function_name().is_some_and(|n| n.starts_with(&code)))
                .and_then(|f| f.function_arn());
            if let Some(arn) = found {
                break arn.to_string();
            }
            marker = page.next_marker().map(str::to_string);
            assert!(marker.is_some(), "no function of query {code}");
        };
        lambda
            .list_tags()
            .resource(arn)
            .send()
            .await
            .expect("ListTags")
            .tags()
            .cloned()
            .unwrap_or_default()
    });
    assert_eq!(
        tags.get("skein:query").map(String::as_str),
        Some(code.as_str()),
        "{tags:?}"
    );
    assert_eq!(
        tags.get("skein:name").map(String::as_str),
        Some(name.as_str()),
        "{tags:?}"
    );
    // `skein status` lists it under its name too.
    let listed: Value =
        serde_json::from_str(skein_aws(&store, &["status", "--json"]).trim()).unwrap();
    assert_eq!(listed["names"][&code], name.as_str(), "{listed}");
    skein_aws(&store, &["destroy", &code, "--purge"]);
    let _ = std::fs::remove_dir_all(&work);
}
