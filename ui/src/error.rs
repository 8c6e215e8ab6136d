//! The page's errors: each names what it was reading or doing.

use std::fmt::Display;

/// What went wrong serving the page or its API.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// A checkpoint store could not be read.
    #[error("checkpoint store {location}: {reason}")]
    Store { location: String, reason: String },
    /// No query by that name.
    #[error("no query {backend}/{code} (GET /api/queries lists them)")]
    NotFound { backend: String, code: String },
    /// The query's text could not be planned.
    #[error("query {code}: planning it: {reason}")]
    Plan { code: String, reason: String },
    /// Lambda (or its schedules, or the deployment's store) answered an error.
    #[error("lambda: {0}")]
    Lambda(String),
    /// Stop and start are for standing queries on Lambda.
    #[error("{0}")]
    Refused(String),
    /// The address could not be listened on.
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
}

impl UiError {
    /// A store error at `location`.
    pub fn store(location: impl Display, reason: impl Display) -> Self {
        UiError::Store {
            location: location.to_string(),
            reason: reason.to_string(),
        }
    }

    /// The HTTP status it answers with.
    pub fn status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            UiError::NotFound { .. } => StatusCode::NOT_FOUND,
            UiError::Refused(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl axum::response::IntoResponse for UiError {
    fn into_response(self) -> axum::response::Response {
        let body = serde_json::json!({ "error": self.to_string() });
        (self.status(), axum::Json(body)).into_response()
    }
}
