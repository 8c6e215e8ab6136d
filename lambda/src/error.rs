//! The error of the Lambda backend's commands as a library: deploying,
//! running, standing queries. Each part keeps its own typed error; this
//! one gathers them, and says what the backend refuses and why.

use crate::checkpoints::CheckpointError;
use crate::esm::EsmError;
use crate::lease::LeaseError;
use crate::schedule::ScheduleError;
use crate::standing::StandingError;
use crate::store::StoreError;

/// What went wrong deploying or running a query on Lambda.
#[derive(Debug, thiserror::Error)]
pub enum LambdaError {
    /// The engine (planning, a function, the epoch loop) failed.
    #[error(transparent)]
    Engine(#[from] skein_engine::EngineError),
    /// The deployment's object store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The query's checkpoint location.
    #[error(transparent)]
    Checkpoints(#[from] CheckpointError),
    /// A standing query's spec or driver.
    #[error(transparent)]
    Standing(#[from] StandingError),
    /// The lease on a checkpoint location.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// EventBridge Scheduler.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A Kinesis event-source mapping.
    #[error(transparent)]
    Mapping(#[from] EsmError),
    /// The object store failed while `doing` something.
    #[error("{doing}: {source}")]
    ObjectStore {
        /// What the backend was doing.
        doing: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A local file (the function binary, its zip).
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// What the backend cannot do as asked, and why (one line).
    #[error("{0}")]
    Refused(String),
}

impl LambdaError {
    /// A refusal with this reason.
    pub fn refused(reason: impl Into<String>) -> Self {
        LambdaError::Refused(reason.into())
    }

    /// An object-store error while `doing` something.
    pub fn store(doing: impl Into<String>) -> impl FnOnce(object_store::Error) -> Self {
        let doing = doing.into();
        move |source| LambdaError::ObjectStore { doing, source }
    }
}

/// The Lambda backend's result type.
pub type Result<T, E = LambdaError> = std::result::Result<T, E>;
