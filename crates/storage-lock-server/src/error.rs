//! The server's one error: what went wrong ([`ErrorKind`], whatever the transport), a stable
//! code and a message, and for `busy` and `lost` the typed detail a caller acts on.
//!
//! [`crate::service::LockService`] answers with it; each transport maps it once: HTTP here
//! ([`ErrorKind::http_status`] and the JSON [`ErrorBody`]), gRPC in `grpc` (a status code, or
//! a session event for a busy acquire).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use storage_lock_core::{HoldGone, HolderInfo, LockError};
use storage_lock_wire::{ErrorBody, Holder};

/// What went wrong, whatever the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
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
    pub(crate) fn http_status(self) -> StatusCode {
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

/// Who holds a busy lock and for how long (unless renewed).
#[derive(Debug, Clone)]
pub(crate) struct BusyDetail {
    pub(crate) holder: Option<Arc<HolderInfo>>,
    pub(crate) left: Duration,
}

/// A failed operation: its [`ErrorKind`], stable code, message and typed detail.
#[derive(Debug)]
pub(crate) struct ServiceError {
    kind: ErrorKind,
    code: &'static str,
    message: String,
    busy: Option<Box<BusyDetail>>,
    lost: Option<HoldGone>,
}

impl ServiceError {
    /// An error of this kind, code and message.
    pub(crate) fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            code,
            message: message.into(),
            busy: None,
            lost: None,
        }
    }

    /// Bad input (`code`): nothing changed.
    pub(crate) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadInput, code, message)
    }

    /// `busy`: another owner holds the lock for `left` more (unless renewed).
    pub(crate) fn busy(name: &str, holder: Option<Arc<HolderInfo>>, left: Duration) -> Self {
        let mut e = Self::new(
            ErrorKind::Busy,
            "busy",
            format!("lock {name:?} is held by another owner"),
        );
        e.busy = Some(Box::new(BusyDetail { holder, left }));
        e
    }

    /// `lost`, with why.
    pub(crate) fn lost(name: &str, why: HoldGone) -> Self {
        let mut e = Self::new(
            ErrorKind::Lost,
            "lost",
            format!("this owner does not hold lock {name:?} ({})", why.code()),
        );
        e.lost = Some(why);
        e
    }

    /// What went wrong.
    pub(crate) fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The stable machine code (`busy`, `lost`, `invalid_owner`, …).
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    /// The message for people.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// For `busy`: who holds the lock and for how long.
    pub(crate) fn busy_detail(&self) -> Option<&BusyDetail> {
        self.busy.as_deref()
    }

    /// For `lost`: why the hold is gone.
    pub(crate) fn lost_reason(&self) -> Option<HoldGone> {
        self.lost
    }

    /// The JSON body of this error.
    pub(crate) fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.code.to_owned(),
            message: self.message.clone(),
            reason: self.lost.map(|why| why.code().to_owned()),
            holder: self
                .busy
                .as_ref()
                .and_then(|b| b.holder.as_deref())
                .map(Holder::from),
            expires_in_ms: self
                .busy
                .as_ref()
                .map(|b| storage_lock_wire::millis(b.left)),
        }
    }
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let mut res = (self.kind.http_status(), Json(self.body())).into_response();
        if let Some(busy) = &self.busy {
            // Retry-After is in whole seconds: round up, at least 1.
            let after = busy.left;
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        res
    }
}

impl From<LockError> for ServiceError {
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

impl From<storage_lock_core::StorageError> for ServiceError {
    fn from(e: storage_lock_core::StorageError) -> Self {
        LockError::from(e).into()
    }
}

impl From<JsonRejection> for ServiceError {
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

impl From<PathRejection> for ServiceError {
    fn from(r: PathRejection) -> Self {
        Self::bad_request("invalid_name", r.body_text())
    }
}

impl From<QueryRejection> for ServiceError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request("invalid_query", r.body_text())
    }
}
