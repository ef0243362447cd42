//! The server's one error: what went wrong ([`ErrorKind`], whatever the transport) with its
//! stable code and message ([`ErrorBody`]). Each transport maps the kind once: HTTP statuses
//! here ([`ErrorKind::http_status`]), gRPC codes in `grpc`.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use storage_lock_core::{HoldGone, LockError};
use utoipa::ToSchema;

use crate::wire::Holder;

/// The body of every non-2xx response: a stable machine code and a message for people.
///
/// Codes: `invalid_body`, `unsupported_media_type`, `body_too_large`, `invalid_name`,
/// `invalid_owner`, `invalid_options`, `lease_out_of_range`, `invalid_query`, `unauthorized`,
/// `forbidden`, `not_found`, `method_not_allowed`, `busy` (409), `lost` (410),
/// `unavailable` (503: the storage cannot be reached; retry), `internal` (500).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable machine-readable code.
    #[schema(example = "busy")]
    pub error: String,
    /// What happened, for people.
    pub message: String,
    /// For `lost`: why the hold is gone (`released`, `expired`, `force_released`,
    /// `taken_over`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `busy`: who holds the lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// For `busy`: how long the current hold lasts unless renewed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
}

/// What went wrong, whatever the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Malformed or invalid input; nothing changed.
    BadInput,
    /// The request body is over the size limit.
    TooLarge,
    /// The request body is not JSON.
    UnsupportedMedia,
    /// No or an unknown bearer token.
    Unauthenticated,
    /// The token's grants do not cover the operation.
    Forbidden,
    /// No such route.
    NotFound,
    /// The route exists, the method does not.
    MethodNotAllowed,
    /// Another owner holds the lock.
    Busy,
    /// This owner's hold is gone.
    Lost,
    /// The request is well formed but cannot be served for this lock (its fencing token
    /// reached the storage's bound).
    Unprocessable,
    /// The storage cannot be reached; retry.
    Unavailable,
    /// A bug.
    Internal,
}

impl ErrorKind {
    /// The HTTP status of this kind.
    pub fn http_status(self) -> StatusCode {
        match self {
            Self::BadInput => StatusCode::BAD_REQUEST,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMedia => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Busy => StatusCode::CONFLICT,
            Self::Lost => StatusCode::GONE,
            Self::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A failed request: its [`ErrorKind`] plus [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    kind: ErrorKind,
    body: Box<ErrorBody>,
    retry_after: Option<Duration>,
}

impl ApiError {
    /// An error of this kind, code and message.
    pub fn new(kind: ErrorKind, code: &str, message: impl Into<String>) -> Self {
        Self {
            kind,
            body: Box::new(ErrorBody {
                error: code.to_owned(),
                message: message.into(),
                reason: None,
                holder: None,
                expires_in_ms: None,
            }),
            retry_after: None,
        }
    }

    /// 400 with `code`.
    pub fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadInput, code, message)
    }

    /// 409 `busy`: another owner holds the lock for `left` more (unless renewed).
    pub fn busy(name: &str, holder: Option<Holder>, left: Option<Duration>) -> Self {
        let mut e = Self::new(
            ErrorKind::Busy,
            "busy",
            format!("lock {name:?} is held by another owner"),
        );
        e.body.holder = holder;
        e.body.expires_in_ms = left.map(crate::wire::millis);
        // Retry-After is in whole seconds: round up, at least 1.
        e.retry_after = Some(left.unwrap_or(Duration::from_secs(1)));
        e
    }

    /// 410 `lost`, with why.
    pub fn lost(name: &str, why: HoldGone) -> Self {
        let mut e = Self::new(
            ErrorKind::Lost,
            "lost",
            format!("this owner does not hold lock {name:?} ({})", why.code()),
        );
        e.body.reason = Some(why.code().to_owned());
        e
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.http_status()
    }

    /// The body.
    pub fn body(&self) -> &ErrorBody {
        &self.body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.kind.http_status(), Json(*self.body)).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        res
    }
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        let msg = e.to_string();
        match e {
            LockError::InvalidName { .. } => Self::bad_request("invalid_name", msg),
            LockError::InvalidOptions { .. } => Self::bad_request("invalid_options", msg),
            LockError::LeaseOutOfRange { .. } => Self::bad_request("lease_out_of_range", msg),
            LockError::NotHeld { .. } => Self::new(ErrorKind::Lost, "lost", msg),
            LockError::FencingExhausted { .. } => {
                Self::new(ErrorKind::Unprocessable, "fencing_exhausted", msg)
            }
            LockError::Storage(_) | LockError::Unsafe { .. } | LockError::Cancelled => {
                tracing::warn!(error = %msg, "storage failure");
                Self::new(ErrorKind::Unavailable, "unavailable", msg)
            }
            _ => Self::new(ErrorKind::Internal, "internal", msg),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        // Syntax and shape errors alike are 400 `invalid_body`.
        let (kind, code) = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => (ErrorKind::TooLarge, "body_too_large"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                (ErrorKind::UnsupportedMedia, "unsupported_media_type")
            }
            _ => (ErrorKind::BadInput, "invalid_body"),
        };
        Self::new(kind, code, r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::bad_request("invalid_name", r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request("invalid_query", r.body_text())
    }
}
