//! `skein ui`: a web page of the queries `skein status` knows (local
//! checkpoint directories, queries deployed on Lambda) with their stage
//! graph, rates, lag, watermarks, checkpoints and cost, and the JSON API
//! it reads (docs/ui.md). The page and its script are compiled into the
//! binary; nothing is fetched at run time. It has no authentication: it
//! binds 127.0.0.1 unless told otherwise, and says so.

mod assets;
pub mod catalog;
mod deploy;
mod editor;
mod error;
pub mod graph;
pub mod records;
mod routes;
pub mod sources;
pub mod view;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use skein_engine::catalog::Catalog;
use skein_engine::planner::QueryPlan;
use tokio::sync::Mutex;

pub use error::UiError;

/// How `skein ui` was started.
#[derive(Clone)]
pub struct UiOptions {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Where local queries keep their checkpoint directories.
    pub checkpoint_root: PathBuf,
    /// The Lambda deployment's store (`SKEIN_STORE`); `None`: do not look
    /// at Lambda.
    pub lambda_store: Option<String>,
    /// The table kinds queries may use (to plan them and ask their
    /// sources for lag).
    pub catalog: Catalog,
    /// The `skein` binary that runs and deploys the queries the page starts.
    pub launcher: PathBuf,
    /// The clusters whose streams the page lists (`--kafka`).
    pub sources: Vec<sources::SourceCluster>,
}

/// What the handlers share.
pub(crate) struct App {
    pub options: UiOptions,
    /// Plans by (query code, group size): planning is not free.
    pub plans: Mutex<HashMap<(String, usize), Arc<QueryPlan>>>,
}

/// Serve the page and its API until the process is stopped.
pub async fn serve(options: UiOptions) -> Result<(), UiError> {
    let listen = options.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| UiError::Listen {
            addr: listen.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| UiError::Listen {
        addr: listen.to_string(),
        source,
    })?;
    announce(addr);
    let app = Arc::new(App {
        options,
        plans: Default::default(),
    });
    axum::serve(listener, routes::router(app))
        .await
        .map_err(|source| UiError::Listen {
            addr: addr.to_string(),
            source,
        })
}

/// The address, and that anyone who reaches it can stop and start queries.
fn announce(addr: SocketAddr) {
    println!("skein ui: http://{addr}/");
    println!(
        "no authentication: anyone who can reach this address can see the queries and stop or \
         start standing ones"
    );
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: listening on {}, which is not a loopback address: put an authenticating \
             proxy in front of it",
            addr.ip()
        );
    }
}
