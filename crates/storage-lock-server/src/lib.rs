//! The storage-lock server: the lock engine over HTTP, for any language.
//!
//! The server is **stateless** over its storage: it keeps no lock state of its own, so several
//! replicas over one PostgreSQL or Redis serve the same locks, and a restart loses nothing.
//! Clients name an owner id (a 128-bit secret) that renews and releases their hold and makes
//! acquire retries idempotent. Run it with `storage-lock serve`, or embed it:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> std::io::Result<()> {
//! use storage_lock_core::{MemoryStorage, StorageLock};
//! use storage_lock_server::Server;
//!
//! let locks = StorageLock::new(MemoryStorage::new()).expect("memory passes the gate");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7420").await?;
//! Server::new(locks).serve(listener, std::future::pending()).await
//! # }
//! ```
//!
//! # Routes
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/locks/{name}/acquire` | `{lease_ms, wait_ms?, owner?, note?, holder?}` → 200 hold · 409 busy (+ `Retry-After`) |
//! | `POST /v1/locks/{name}/renew` | `{owner, lease_ms}` → 200 · 410 lost, with `reason` |
//! | `POST /v1/locks/{name}/release` | `{owner}` → 200 `{released, fencing_token?}`: what it released (safe to retry) |
//! | `POST /v1/locks/{name}/force-release` | admin: `{expected_fencing_token?, reason?}` |
//! | `POST /v1/sweep` | admin: `{prefix?, older_than_ms?}` → `{deleted, fencing_floor}` |
//! | `GET /v1/locks?prefix=&cursor=&limit=` | a page of locks |
//! | `GET /v1/locks/{name}?wait_ms=&while=held` | one lock; blocking read with `wait_ms` |
//! | `GET /v1/locks/{name}/events?limit=` | its recent events seen by this replica (who force-released, why) |
//! | `GET /v1/storage` | what the storage behind the server promises (durability, …) |
//! | `GET /openapi.json` | the OpenAPI 3.1 document of all of the above |
//! | `GET /metrics` | Prometheus text (when a recorder handle is given) |
//! | `GET /healthz`, `GET /readyz` | the process is up · the storage answers |
//! | `GET /ui` | the live web page (see `ui`): locks, holders, time left; admin force-release |
//! | gRPC `storagelock.v1.LockService/*` | the same operations, and sessions (see `grpc`) |
//!
//! **One service, thin transports.** Every operation lives once in the crate's `service`
//! module (typed requests and answers, one error type with the busy and lost details); the
//! HTTP routes (`api`), the gRPC service (`grpc`) and the web page (`ui`) only translate their
//! wire formats to it and back, and each maps the error once. The JSON bodies are the
//! [`wire`] crate's, shared with `storage-lock-client`.
//!
//! gRPC (HTTP/2) and HTTP share the port. The gRPC service's contract, including the status
//! code table (busy → `ABORTED`, lost → `FAILED_PRECONDITION`, bad input → `INVALID_ARGUMENT`,
//! 401 → `UNAUTHENTICATED`, 403 → `PERMISSION_DENIED`, storage down → `UNAVAILABLE`; the HTTP
//! error code in the `x-error-code` metadata entry), is in the `storage-lock-proto` crate. A
//! gRPC **session** is a stream: the server renews its locks while the client pings, releases
//! them when the stream ends, and reports `Lost` at once when a renewal fails.
//!
//! Names may contain `/` (send `%2F`). Fencing tokens travel as decimal **strings** (u64 does not
//! fit a JavaScript number). Every error has the body `{"error": code, "message": …}`; bad input
//! is always a 4xx and never leaves anything held. Responses carry durations (`expires_in_ms`,
//! counted from when the server decided): a client counts them from when it *sent* the request
//! and never compares its clock with the server's.
//!
//! Long polls (`wait_ms`, at most [`MAX_WAIT_MS`]) wait on the storage's change notifications.
//! A client that disconnects cancels its wait, and a grant that lands after the disconnect is
//! released at once.
//!
//! **Shutdown.** [`Server::serve`] stops accepting when `shutdown` completes and lets requests
//! in flight finish (long polls included, ≤ 30 s). Locks held through the HTTP API are the
//! clients': they stay held until released or their lease ends, whatever happens to the server.
//! gRPC sessions end: their locks are reported `Lost` to the client and left to their leases.
//!
//! **TLS.** [`Server::serve_tls`] serves HTTPS and gRPC over TLS on the port, optionally
//! requiring client certificates (see [`tls`]); `storage-lock serve --tls-cert --tls-key
//! [--tls-client-ca]` runs it.
//!
//! **Auth.** See [`auth`]: bearer tokens stored as SHA-256 hashes, per-prefix `read` / `lock` /
//! `admin` grants. Admin actions are logged on the `storage_lock::audit` target with who, what
//! and which fencing token.

mod api;
pub mod auth;
mod error;
mod grpc;
mod listen;
mod observe;
mod recorder;
mod service;
pub mod tls;
mod ui;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use storage_lock_core::StorageLock;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use auth::{Auth, AuthFileError, AuthHandle, Permission, hash_token};
pub use observe::{COUNT_HELD_EVERY, COUNT_HELD_UP_TO, install_prometheus};
/// The JSON types of the HTTP API (the `storage-lock-wire` crate).
pub use storage_lock_wire as wire;
pub use storage_lock_wire::{MAX_LEASE_MS, MAX_WAIT_MS};
pub use tls::{TlsConfig, TlsError};

/// The largest request body: 64 KiB (larger ones get `413 body_too_large`).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "storage-lock",
        description = "Distributed locks with fencing tokens over any storage. Fencing tokens are decimal strings; durations are milliseconds counted from when the server decided.",
    ),
    tags(
        (name = "locks", description = "Acquire, renew, release and read locks"),
        (name = "admin", description = "Operator actions"),
        (name = "kinds", description = "What the lock kinds (semaphores, reader-writer locks) keep beside their holds"),
    ),
    components(schemas(storage_lock_wire::WhileState)),
    modifiers(&BearerAuth),
    security(("bearer" = []), ()),
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        openapi
            .components
            .get_or_insert_default()
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
    }
}

/// A lock server over one [`StorageLock`].
pub struct Server {
    locks: StorageLock,
    auth: Option<AuthHandle>,
    metrics: Option<PrometheusHandle>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Server {
    /// A server for `locks`, without auth (anyone reaching the port may lock anything; the
    /// `serve` command refuses that on non-loopback addresses) and without `/metrics`.
    ///
    /// Give it a [`StorageLock`] with the default normalizer: lists show storage keys, and
    /// per-prefix grants are checked against them.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{MemoryStorage, StorageLock};
    /// let server = storage_lock_server::Server::new(StorageLock::new(MemoryStorage::new()).unwrap());
    /// let router = server.router(); // serve it, or nest it in a larger axum application
    /// # drop(router);
    /// ```
    pub fn new(locks: impl Into<StorageLock>) -> Self {
        Self {
            locks: locks.into(),
            auth: None,
            metrics: None,
            shutdown: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Requires bearer tokens as `auth` says.
    #[must_use]
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = Some(AuthHandle::new(auth));
        self
    }

    /// The handle that replaces the tokens while the server runs (`None` without
    /// [`Self::auth`]).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{MemoryStorage, StorageLock};
    /// use storage_lock_server::{Auth, Server};
    /// let server = Server::new(StorageLock::new(MemoryStorage::new()).unwrap()).auth(Auth::default());
    /// let handle = server.auth_handle().expect("auth is on");
    /// handle.replace(Auth::from_toml("").unwrap()); // e.g. on SIGHUP, from the file
    /// assert!(handle.current().is_empty());
    /// ```
    pub fn auth_handle(&self) -> Option<AuthHandle> {
        self.auth.clone()
    }

    /// Serves `/metrics` from this recorder handle (install the recorder once per process,
    /// with [`install_prometheus`] for histograms with explicit buckets) and gives every
    /// metric its help text; the engine's and the server's metrics are recorded through the
    /// `metrics` facade either way. The `observe` module docs list them.
    #[must_use]
    pub fn metrics(mut self, handle: PrometheusHandle) -> Self {
        observe::describe();
        self.metrics = Some(handle);
        self
    }

    /// The OpenAPI 3.1 document of the HTTP API.
    ///
    /// # Examples
    /// ```
    /// let doc = storage_lock_server::Server::openapi();
    /// assert!(doc.paths.paths.contains_key("/v1/locks/{name}/acquire"));
    /// ```
    pub fn openapi() -> utoipa::openapi::OpenApi {
        Self::api_router().split_for_parts().1
    }

    fn api_router() -> OpenApiRouter<Arc<service::LockService>> {
        OpenApiRouter::with_openapi(ApiDoc::openapi())
            .routes(routes!(api::acquire))
            .routes(routes!(api::renew))
            .routes(routes!(api::release))
            .routes(routes!(api::force_release))
            .routes(routes!(api::semaphore_limit, api::set_semaphore_limit))
            .routes(routes!(api::parts))
            .routes(routes!(api::sweep))
            .routes(routes!(api::list))
            .routes(routes!(api::get))
            .routes(routes!(api::events))
            .routes(routes!(api::storage_info))
    }

    /// The routes as an axum [`Router`], to serve or to nest in a larger application.
    pub fn router(self) -> Router {
        let (api, doc) = Self::api_router().split_for_parts();
        let doc = Arc::new(doc);
        let metrics = self.metrics;
        let state = Arc::new(service::LockService {
            locks: self.locks,
            auth: self.auth,
            shutdown: self.shutdown,
            recorder: Arc::new(recorder::Recorder::default()),
            held_counted: std::sync::Mutex::new(None),
        });
        // History starts with the server, not with the first visit to the page (outside a
        // runtime, at the first request that needs it).
        if tokio::runtime::Handle::try_current().is_ok() {
            state.recorder.start(&state.locks);
        }
        let grpc =
            storage_lock_proto::v1::lock_service_server::LockServiceServer::new(grpc::Grpc {
                svc: state.clone(),
            })
            .max_decoding_message_size(MAX_BODY_BYTES);
        let http = api
            .route(
                "/openapi.json",
                get(move || {
                    let doc = doc.clone();
                    async move { axum::Json(doc.as_ref().clone()) }
                }),
            )
            .route(
                "/metrics",
                get(
                    move |axum::extract::State(st): axum::extract::State<
                        Arc<service::LockService>,
                    >| {
                        let m = metrics.clone();
                        async move {
                            match m {
                                Some(handle) => {
                                    observe::count_held(&st.locks, &st.held_counted).await;
                                    (
                                        [(
                                            axum::http::header::CONTENT_TYPE,
                                            "text/plain; version=0.0.4",
                                        )],
                                        handle.render(),
                                    )
                                        .into_response()
                                }
                                None => api::not_found().await.into_response(),
                            }
                        }
                    },
                ),
            )
            .merge(ui::routes())
            .route("/healthz", get(api::healthz))
            .route("/readyz", get(api::readyz))
            .fallback(api::fallback)
            .method_not_allowed_fallback(api::method_not_allowed)
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(state);
        // gRPC joins the HTTP routes (one port); unknown paths still get the HTTP 404.
        tonic::service::Routes::from(http)
            .add_service(grpc)
            .into_axum_router()
            .layer(axum::middleware::from_fn(observe::observe))
    }

    /// Serves HTTP/1.1 and HTTP/2 (cleartext; gRPC needs HTTP/2) on `listener` until `shutdown` completes, then
    /// lets requests in flight finish.
    ///
    /// # Errors
    /// Accepting connections failed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_on(listen::NoDelay(listener), shutdown).await
    }

    /// Like [`Self::serve`], over TLS: HTTPS and gRPC over TLS (ALPN `h2`, `http/1.1`), with
    /// client certificates required if `tls` says so (see [`tls`]).
    ///
    /// # Errors
    /// The listener's address could not be read, or accepting connections failed.
    ///
    /// # Examples
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use storage_lock_core::{MemoryStorage, StorageLock};
    /// use storage_lock_server::{Server, TlsConfig};
    /// let tls = TlsConfig::from_pem_files("cert.pem".as_ref(), "key.pem".as_ref(), None)?;
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:7420").await?;
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// Server::new(locks).serve_tls(listener, &tls, std::future::pending()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn serve_tls(
        self,
        listener: tokio::net::TcpListener,
        tls: &TlsConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let listener = tls::TlsListener::new(listener, tls)?;
        self.serve_on(listener, shutdown).await
    }

    async fn serve_on<L>(
        self,
        listener: L,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()>
    where
        L: axum::serve::Listener<Addr = std::net::SocketAddr>,
        listen::Peer:
            for<'a> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, L>>,
    {
        let sessions = self.shutdown.clone();
        // The peer address names the holder of an API client's hold (see `api`).
        let app = self
            .router()
            .into_make_service_with_connect_info::<listen::Peer>();
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                sessions.cancel(); // gRPC sessions end (see the grpc module), so shutdown can finish
            })
            .await
    }

    /// Serves on a spare loopback port (`127.0.0.1:0`) in a background task of the current
    /// tokio runtime, until that runtime shuts down; returns the base URL
    /// (`http://127.0.0.1:PORT`). For tests and examples: one line instead of bind, address,
    /// spawn.
    ///
    /// # Errors
    /// The port could not be bound.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
    /// use storage_lock_core::{MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    /// let base = storage_lock_server::Server::new(locks).spawn_on_loopback().await?;
    /// assert!(base.starts_with("http://127.0.0.1:"));
    /// # Ok(()) }
    /// ```
    pub async fn spawn_on_loopback(self) -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            if let Err(e) = self.serve(listener, std::future::pending()).await {
                tracing::warn!(error = %e, "the loopback server stopped");
            }
        });
        Ok(base)
    }
}

use axum::response::IntoResponse;
