//! A request to change a function group's size, left in the query's store
//! by `skein rescale` and carried out by the running driver right after
//! its next commit (so a query that is not running takes it when it
//! starts). One object: a later request replaces an earlier one. In a
//! local directory it is a plain file beside the segment log, which only
//! the running process writes.

use serde::{Deserialize, Serialize};

use super::io::Backend;
use super::{CheckpointStore, Kind, Layout, corrupt, epoch_name, epoch_of};
use crate::error::{EngineError, Result};

/// What `skein rescale` asks of a running query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescaleRequest {
    /// The stage whose group changes size.
    pub stage: u32,
    /// Its new size.
    pub members: u32,
}

const NAME: &str = "rescale.json";

fn io_error(what: &str, path: &std::path::Path, e: std::io::Error) -> EngineError {
    EngineError::Context(format!("{what} {}: {e}", path.display()))
}

impl CheckpointStore {
    /// Leave a request for the driver.
    pub async fn ask_rescale(&self, request: RescaleRequest) -> Result<()> {
        match &self.backend {
            Backend::Dir(d) => {
                let path = d.side_file(NAME);
                let part = d.side_file(&format!("{NAME}.part"));
                let bytes = serde_json::to_vec(&request).expect("a request serializes");
                std::fs::write(&part, bytes).map_err(|e| io_error("writing", &part, e))?;
                // Renamed into place: the driver reads all of it or none.
                std::fs::rename(&part, &path).map_err(|e| io_error("renaming", &path, e))
            }
            Backend::Objects(_) => {
                self.put_json(Kind::Other, &self.key(&[NAME]), &request)
                    .await
            }
        }
    }

    /// The request waiting, if any.
    pub async fn rescale_request(&self) -> Result<Option<RescaleRequest>> {
        match &self.backend {
            Backend::Dir(d) => {
                let path = d.side_file(NAME);
                match std::fs::read(&path) {
                    Ok(bytes) => serde_json::from_slice(&bytes)
                        .map(Some)
                        .map_err(|e| corrupt(&self.key(&[NAME]), e)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io_error("reading", &path, e)),
                }
            }
            Backend::Objects(_) => self.get_json(&self.key(&[NAME])).await,
        }
    }

    /// Record that the epochs from `epoch` on run in `layout`, before any of
    /// them runs: a driver restarting after the commit before `epoch` runs
    /// them in it again, so an epoch run twice (its sink writes replayed)
    /// is run by the same members both times.
    pub async fn put_layout_from(&self, epoch: u64, layout: &Layout) -> Result<()> {
        let name = format!("{}.json", epoch_name(epoch));
        self.put_json(Kind::Driver, &self.key(&["layouts", &name]), layout)
            .await
    }

    /// The layout recorded for the epochs from `epoch` on, if a rescale
    /// recorded one.
    pub async fn layout_from(&self, epoch: u64) -> Result<Option<Layout>> {
        let name = format!("{}.json", epoch_name(epoch));
        self.get_json(&self.key(&["layouts", &name])).await
    }

    /// The group sizes the epochs after the last commit run in: a rescale's
    /// after that commit, else the commit's own. `None` before any commit
    /// (every group has its planned size). Two GETs.
    pub async fn next_layout(&self) -> Result<Option<Layout>> {
        let Some((commit, layout)) = self.committed_in().await? else {
            return Ok(None);
        };
        Ok(Some(
            self.layout_from(commit.epoch + 1).await?.unwrap_or(layout),
        ))
    }

    /// The last `n` layouts rescales recorded, oldest first: (the first
    /// epoch run in it, every group's size then).
    pub async fn layouts(&self, n: usize) -> Result<Vec<(u64, Layout)>> {
        let mut epochs: Vec<u64> = self
            .backend
            .list(&self.key(&["layouts"]))
            .await?
            .iter()
            .filter_map(|o| epoch_of(&o.key))
            .collect();
        epochs.sort_unstable();
        let mut out = vec![];
        for epoch in epochs.iter().skip(epochs.len().saturating_sub(n)) {
            if let Some(layout) = self.layout_from(*epoch).await? {
                out.push((*epoch, layout));
            }
        }
        Ok(out)
    }

    /// The request was carried out (or refused): it goes.
    pub async fn rescale_done(&self) -> Result<()> {
        match &self.backend {
            Backend::Dir(d) => {
                let path = d.side_file(NAME);
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(io_error("removing", &path, e))
                    }
                    _ => Ok(()),
                }
            }
            Backend::Objects(_) => self.backend.delete(vec![self.key(&[NAME])]).await,
        }
    }
}
