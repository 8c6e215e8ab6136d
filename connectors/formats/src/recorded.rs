//! Unit tests only: a schema registry that answers with recorded responses
//! of the Confluent Schema Registry API (the bodies as the API documents
//! them), on a port of 127.0.0.1, and keeps the requests it got.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One request as received: method, path, the Authorization header, body.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) authorization: Option<String>,
    pub(crate) body: String,
}

/// A server of recorded answers by `"METHOD /path"`; any other request is a
/// 404 with the registry's error body.
pub(crate) struct Recorded {
    pub(crate) url: String,
    pub(crate) requests: Arc<Mutex<Vec<Request>>>,
}

impl Recorded {
    pub(crate) fn start(answers: &[(&str, u16, &str)]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        Self::serve(listener, answers)
    }

    /// Serve on `listener` (a port chosen before, for a registry that comes up late).
    pub(crate) fn serve(listener: TcpListener, answers: &[(&str, u16, &str)]) -> Self {
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let answers: HashMap<String, (u16, String)> = answers
            .iter()
            .map(|(k, s, b)| (k.to_string(), (*s, b.to_string())))
            .collect();
        let requests = Arc::new(Mutex::new(vec![]));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Some(r) = read_request(&stream) {
                    let key = format!("{} {}", r.method, r.path);
                    let (status, body) = answers.get(&key).cloned().unwrap_or((
                        404,
                        r#"{"error_code":40403,"message":"Schema not found"}"#.into(),
                    ));
                    seen.lock().unwrap().push(r);
                    let mut s = &stream;
                    let _ = write!(
                        s,
                        "HTTP/1.1 {status} X\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            }
        });
        Recorded { url, requests }
    }
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let (mut length, mut authorization) = (0usize, None);
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "authorization" => authorization = Some(value.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        authorization,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
