//! [`DynamoDbStorage`]: storage-lock on an Amazon DynamoDB table.
//!
//! # How it works
//! * **One item per lock** in a table whose partition key is the string attribute `k` (the
//!   storage's prefix + the lock key; no sort key). The item's `r` (binary) is the encoded record
//!   and `v` (number) its version: a random 64-bit number drawn for every write, so a version
//!   never comes back after a delete and a re-create (no ABA).
//! * **Compare-and-set** with condition expressions: create is `PutItem` with
//!   `attribute_not_exists(k)`, update is `PutItem` with `v = :expected`, delete is `DeleteItem`
//!   with `v = :expected`; a `ConditionalCheckFailedException` is the typed conflict. Each
//!   `PutItem` asks for `ReturnValuesOnConditionCheckFailure=ALL_OLD`, so a refusal carries the
//!   item the condition found ([`StorageError::with_current`]) and a contender that lost a race
//!   decides on it without a `GetItem`: one request (an emulator without the option, such as
//!   dynalite, costs the read). Reads are
//!   `GetItem` with `ConsistentRead`. DynamoDB's conditional writes on one item and its strongly
//!   consistent reads are linearizable (AWS documents both), which is all the engine needs.
//!   A multi-lock ([`Primitives::write_all`]) is one `TransactWriteItems` of those `Put`s,
//!   applied together or not at all.
//! * **Time: observed** ([`TimeSource::Observed`], proof in
//!   [`storage_lock_core::storage::observed`]): a contender judges a hold over once it has seen
//!   the same version for the lease left in it, timed on its own monotonic clock. No wall clock
//!   decides anything: not the client's, and not the service's `Date` header either, whose
//!   one-second steps come from whichever front-end host answered. (A TTL attribute is no help:
//!   DynamoDB deletes expired items within days, not at the deadline.)
//! * **One region**: a global table is refused at open unless it has multi-region strong
//!   consistency. With eventually consistent replicas each region checks conditions on its own
//!   copy and the last writer wins, so two regions could each grant the same lock.
//! * **Durability**: DynamoDB acknowledges a write once it is stored durably in several
//!   availability zones ([`Durability::Durable`]). An **emulator** (`emulator=true`: ministack,
//!   DynamoDB Local in memory) keeps tables in memory, so a restart forgets every lock: such a
//!   URL is refused unless it also says `durability=volatile`.
//! * **The table** is created at open if it does not exist (on-demand capacity) unless
//!   `create=false`; an existing table must have exactly the key schema above.
//! * **Requests** are signed with SigV4 ([`Credentials`]: `AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, read once at open, or
//!   [`DynamoDbStorageBuilder::credentials`]; no profile files, SSO or instance roles, and
//!   temporary credentials are not refreshed: reopen the storage before they expire, or every
//!   request is [`StorageError::Denied`] and held locks are lost). SigV4 itself refuses a client
//!   whose clock is more than about 5 minutes off, which is the only part a wall clock plays.
//!   Requests are never retried or redirected: an outage surfaces within one `timeout` (default 2 s), and an answer lost on
//!   the way is an error of unknown outcome that the engine resolves by reading the item.
//! * **Listing** is a consistent `Scan` filtered on the prefix: it reads the whole table, so
//!   keep admin listings off tables shared with other data.
//! * **Waiting** backs off with jitter (DynamoDB Streams would notify, at a cost per shard).
//! * **Permissions** it needs: `dynamodb:DescribeTable` (and `CreateTable` unless
//!   `create=false`), `GetItem`, `PutItem`, `DeleteItem`, `Scan` for listings and sweeps, and
//!   `TransactWriteItems` for multi-locks (without it, a multi-lock fails with the service's
//!   refusal).
//!
//! # URL
//! `dynamodb://TABLE[/PREFIX][?region=R&endpoint=URL&emulator=true&create=false&timeout=2s&durability=volatile]`:
//! `region` defaults to `AWS_REGION`, then `AWS_DEFAULT_REGION`, then `us-east-1`; `endpoint`
//! to `https://dynamodb.REGION.amazonaws.com`. Credentials come from `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
//!
//! # Examples
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use storage_lock_core::{DistributedLock, StorageLock};
//! use storage_lock_dynamodb::DynamoDbStorage;
//! let storage = DynamoDbStorage::connect("dynamodb://locks?region=eu-west-1").await?;
//! let locks = StorageLock::new(storage)?;
//! let held = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await?;
//! # Ok(()) }
//! ```

mod client;
mod sigv4;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::storage::url::{UrlParts, allow_volatile};
use storage_lock_core::{
    Capabilities, CasWrite, Clock, Durability, LockRecord, MonotonicClock, Page, PageRequest,
    Primitives, Storage, StorageError, Stored, TimeSource, Timestamp, Version,
};

use client::{Client, Refusal};
pub use sigv4::Credentials;

pub(crate) const NAME: &str = "dynamodb";
/// The longest prefix: with the longest lock key (510 bytes) it stays far below DynamoDB's
/// 2048-byte partition key.
const MAX_PREFIX: usize = 1024;
/// Why an emulator URL is refused without `durability=volatile`.
const EMULATOR_FORGETS: &str = "a DynamoDB emulator keeps its tables in memory: a restart \
                                forgets every held lock and fencing token";
const CONDITION_FAILED: &str = "ConditionalCheckFailedException";
/// A single-item write refused because a transaction that includes the item is under way
/// (nothing was written).
const TRANSACTION_CONFLICT: &str = "TransactionConflictException";
/// The most items DynamoDB takes in one `TransactWriteItems`.
pub const MAX_TRANSACT_ITEMS: usize = 100;

fn invalid(reason: impl Into<String>) -> StorageError {
    StorageError::config(NAME, reason.into())
}

/// Locks in one DynamoDB table; see the [crate docs](crate). Cheap to clone (clones share the
/// HTTP connections and the observations).
#[derive(Clone)]
pub struct DynamoDbStorage {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    table: String,
    prefix: String,
    seen: Observations,
    durability: Durability,
    /// Set once the service answered that it does not know `TransactWriteItems` (dynalite):
    /// multi-locks then take their keys one by one without asking again.
    no_transactions: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for DynamoDbStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStorage")
            .field("table", &self.inner.table)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStorage {
    /// A builder (table, prefix, region, endpoint, credentials, timeout, clock).
    pub fn builder() -> DynamoDbStorageBuilder {
        DynamoDbStorageBuilder::default()
    }

    /// `DynamoDbStorageBuilder::from_url(url)?.open()`.
    ///
    /// # Errors
    /// As [`DynamoDbStorageBuilder::from_url`] and [`DynamoDbStorageBuilder::open`].
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        DynamoDbStorageBuilder::from_url(url)?.open().await
    }

    /// The table's key attribute for `key`.
    fn key(&self, key: &str) -> Value {
        json!({ "k": { "S": format!("{}{key}", self.inner.prefix) } })
    }

    async fn call(
        &self,
        operation: &'static str,
        action: &str,
        mut body: Value,
    ) -> Result<Result<Value, Refusal>, StorageError> {
        body["TableName"] = Value::String(self.inner.table.clone());
        self.inner.client.call(operation, action, &body).await
    }

    /// An item read back: its lock key and the record, decoded with the observation rule.
    fn decode(&self, item: &Value) -> Result<(String, Stored), StorageError> {
        let name = item["k"]["S"].as_str().unwrap_or("?");
        // A bad item is reported under its lock key where it has one.
        let key = name.strip_prefix(self.inner.prefix.as_str());
        let corrupt = |reason: &str| StorageError::Corrupt {
            key: key.unwrap_or(name).to_owned(),
            reason: reason.to_owned(),
        };
        let key = key.ok_or_else(|| corrupt("the item's key lacks the storage's prefix"))?;
        let version = item["v"]["N"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&v| v != 0)
            .ok_or_else(|| corrupt("no version (attribute v)"))?;
        let bytes = item["r"]["B"]
            .as_str()
            .and_then(|b| BASE64.decode(b).ok())
            .ok_or_else(|| corrupt("no record (attribute r)"))?;
        let version = Version::from_u64(version);
        let record = self
            .inner
            .seen
            .read(key, &version, &bytes, self.inner.seen.now())?;
        Ok((key.to_owned(), Stored { record, version }))
    }

    /// One conditional `PutItem` of `record` under `key`: the new version, or `refused(key)`
    /// when the condition failed, carrying the item the service found
    /// (`ReturnValuesOnConditionCheckFailure`), so that a lost race needs no `GetItem`.
    async fn put(
        &self,
        operation: &'static str,
        key: &str,
        record: &LockRecord,
        condition: Value,
        refused: fn(&str) -> StorageError,
    ) -> Result<Version, StorageError> {
        let version: u64 = rand::random_range(1..=u64::MAX);
        let (bytes, written) = self.inner.seen.encode(record, version);
        let mut item = self.key(key);
        item["r"] = json!({ "B": BASE64.encode(bytes) });
        item["v"] = json!({ "N": version.to_string() });
        let mut body = condition;
        body["Item"] = item;
        body["ReturnValuesOnConditionCheckFailure"] = json!("ALL_OLD");
        match self.call(operation, "PutItem", body).await? {
            Ok(_) => {
                let version = Version::from_u64(version);
                self.inner.seen.wrote(key, &version, written);
                Ok(version)
            }
            // A transaction (a multi-lock's `write_all`) that includes the item is under way:
            // nothing was written; the engine reads and decides again.
            Err(refusal) if refusal.is(TRANSACTION_CONFLICT) => Err(refused(key)),
            // An emulator that ignores the option (dynalite) sends no item, and an item that
            // does not decode is left to the retry's read to report: the engine reads.
            Err(refusal) if refusal.is(CONDITION_FAILED) => {
                match refusal.body.get("Item").map(|item| self.decode(item)) {
                    Some(Ok((found, current))) if found == key => {
                        Err(refused(key).with_current(current))
                    }
                    _ => Err(refused(key)),
                }
            }
            Err(refusal) => Err(refusal.into_error(operation)),
        }
    }

    /// Creates the table (on-demand capacity) unless it exists, then waits until it is active
    /// and checks its key schema.
    async fn ensure_table(&self, create: bool, patience: Duration) -> Result<(), StorageError> {
        let described = self.call("open", "DescribeTable", json!({})).await?;
        let mut table = match described {
            Ok(answer) => answer,
            Err(refusal) if refusal.is("ResourceNotFoundException") && create => {
                let body = json!({
                    "AttributeDefinitions": [{ "AttributeName": "k", "AttributeType": "S" }],
                    "KeySchema": [{ "AttributeName": "k", "KeyType": "HASH" }],
                    "BillingMode": "PAY_PER_REQUEST",
                });
                match self.call("open", "CreateTable", body).await? {
                    // Another client created it first: fine.
                    Err(r) if !r.is("ResourceInUseException") => {
                        return Err(r.into_error("open"));
                    }
                    _ => json!({}),
                }
            }
            Err(refusal) if refusal.is("ResourceNotFoundException") => {
                return Err(invalid(format!(
                    "table {:?} does not exist (and create=false)",
                    self.inner.table
                )));
            }
            Err(refusal) => return Err(refusal.into_error("open")),
        };
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            // UPDATING (an index being built, a capacity change) serves reads and writes.
            let status = table["Table"]["TableStatus"].as_str().unwrap_or("");
            if status == "ACTIVE" || status == "UPDATING" {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StorageError::backend(
                    NAME,
                    "open",
                    format!(
                        "table {:?} is not active after {patience:?}",
                        self.inner.table
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            table = match self.call("open", "DescribeTable", json!({})).await? {
                Ok(answer) => answer,
                Err(r) if r.is("ResourceNotFoundException") => json!({}),
                Err(r) => return Err(r.into_error("open")),
            };
        }
        usable_table(&table["Table"])
            .map_err(|why| invalid(format!("table {:?} {why}", self.inner.table)))
    }
}

/// Whether a `DescribeTable` answer's `Table` is one this backend can keep its promises on:
/// exactly the string partition key `k`, and no replicas in other regions unless the global
/// table is strongly consistent (with eventual consistency, every region checks conditions on
/// its own copy and the last writer wins: two regions could each grant the same lock).
fn usable_table(table: &Value) -> Result<(), &'static str> {
    let hash_only = table["KeySchema"].as_array().is_some_and(|keys| {
        keys.len() == 1 && keys[0]["AttributeName"] == "k" && keys[0]["KeyType"] == "HASH"
    });
    let string_key = table["AttributeDefinitions"]
        .as_array()
        .is_some_and(|defs| {
            defs.iter()
                .any(|d| d["AttributeName"] == "k" && d["AttributeType"] == "S")
        });
    if !(hash_only && string_key) {
        return Err("must have exactly one key, the string partition key \"k\"");
    }
    let replicated = table["Replicas"].as_array().is_some_and(|r| !r.is_empty());
    if replicated && table["MultiRegionConsistency"] != "STRONG" {
        return Err(
            "is a global table with eventually consistent replicas: conditional writes in two \
             regions can both succeed, so two holders could each be granted the lock (use a \
             table in one region, or multi-region strong consistency)",
        );
    }
    Ok(())
}

/// A version this storage wrote: the number compared against `v`.
fn expected_version(key: &str, expected: &Version) -> Result<Value, StorageError> {
    expected
        .as_u64()
        .filter(|&v| v != 0)
        .map(|v| json!({ ":v": { "N": v.to_string() } }))
        .ok_or_else(|| StorageError::conflict(key))
}

/// Configures a [`DynamoDbStorage`]: from a URL or with setters, then [`Self::open`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct DynamoDbStorageBuilder {
    table: String,
    prefix: String,
    region: Option<String>,
    endpoint: Option<String>,
    credentials: Option<Credentials>,
    timeout: Duration,
    emulator: bool,
    allow_volatile: bool,
    create_table: bool,
    clock: Arc<dyn Clock>,
}

impl Default for DynamoDbStorageBuilder {
    fn default() -> Self {
        Self {
            table: String::new(),
            prefix: String::new(),
            region: None,
            endpoint: None,
            credentials: None,
            timeout: Duration::from_secs(2),
            emulator: false,
            allow_volatile: false,
            create_table: true,
            clock: Arc::new(MonotonicClock),
        }
    }
}

impl fmt::Debug for DynamoDbStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStorageBuilder")
            .field("table", &self.table)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("credentials", &self.credentials)
            .field("timeout", &self.timeout)
            .field("emulator", &self.emulator)
            .field("allow_volatile", &self.allow_volatile)
            .field("create_table", &self.create_table)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStorageBuilder {
    /// A builder from
    /// `dynamodb://TABLE[/PREFIX][?region=R&endpoint=URL&emulator=true&create=false&timeout=2s&durability=…]`
    /// (see the [crate docs](crate#url)); credentials from the environment unless set.
    ///
    /// # Errors
    /// [`StorageError::Config`] for another scheme, a bad table name, a user or a port, an
    /// unknown option or a bad value; nothing is contacted.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_dynamodb::DynamoDbStorageBuilder;
    /// let b = DynamoDbStorageBuilder::from_url("dynamodb://locks/app/?region=eu-west-1")?;
    /// assert!(format!("{b:?}").contains("eu-west-1"));
    /// assert!(DynamoDbStorageBuilder::from_url("dynamodb://a?emulator=maybe").is_err());
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        let table = match u.hosts.as_slice() {
            [table] if u.scheme == "dynamodb" && u.user.is_none() => table.clone(),
            _ => return Err(invalid("expected dynamodb://TABLE[/PREFIX]")),
        };
        let mut b = Self::new().table(table).prefix(std::mem::take(&mut u.path));
        b.region = u.take("region");
        b.endpoint = u.take("endpoint");
        if let Some(timeout) = u.take_duration("timeout").map_err(invalid)? {
            b.timeout = timeout;
        }
        let flag = |name: &str, value: Option<String>| match value.as_deref() {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(invalid(format!(
                "{name} must be true or false, not {other:?}"
            ))),
        };
        if let Some(emulator) = flag("emulator", u.take("emulator"))? {
            b.emulator = emulator;
        }
        if let Some(create) = flag("create", u.take("create"))? {
            b.create_table = create;
        }
        if let Some(v) = u.take("durability") {
            b.allow_volatile = allow_volatile(&v).map_err(invalid)?;
        }
        u.finish(&[]).map_err(invalid)?;
        b.check()?;
        Ok(b)
    }

    /// A builder from `STORAGE_LOCK_DYNAMODB_URL` (see [`Self::from_url`]).
    ///
    /// # Errors
    /// [`StorageError::Config`] if the variable is unset or its URL is invalid.
    pub fn from_env() -> Result<Self, StorageError> {
        let url = std::env::var("STORAGE_LOCK_DYNAMODB_URL")
            .map_err(|_| invalid("STORAGE_LOCK_DYNAMODB_URL is not set"))?;
        Self::from_url(&url)
    }

    /// The defaults: no table yet, no prefix, region and credentials from the environment,
    /// AWS's endpoint, timeout 2 s, the table created if missing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table (3 to 255 of `A-Z a-z 0-9 _ . -`).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// What every item key of this storage starts with (at most 1024 bytes).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The AWS region (default: `AWS_REGION`, `AWS_DEFAULT_REGION`, `us-east-1`).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Another endpoint than AWS's (`http(s)://host[:port]`): an emulator, a VPC endpoint.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// The credentials to sign with (default: from the environment at [`Self::open`]).
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// How long one request may take (connecting included) before it fails.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoint is an emulator that keeps its tables in memory (see the
    /// [crate docs](crate)): [`Self::open`] then refuses unless [`Self::allow_volatile`].
    pub fn emulator(mut self, yes: bool) -> Self {
        self.emulator = yes;
        self
    }

    /// Accepts a store that forgets every lock on a restart (an emulator;
    /// `durability=volatile`): it then opens as [`Durability::Volatile`].
    pub fn allow_volatile(mut self, yes: bool) -> Self {
        self.allow_volatile = yes;
        self
    }

    /// Whether [`Self::open`] creates a missing table (default `true`).
    pub fn create_table(mut self, yes: bool) -> Self {
        self.create_table = yes;
        self
    }

    /// The clock this client times its observations on (default [`MonotonicClock`]; see the
    /// [crate docs](crate)): only its rate matters, and it must not step backwards.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn check(&self) -> Result<(), StorageError> {
        let t = &self.table;
        if !(3..=255).contains(&t.len())
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(invalid(format!(
                "table name must be 3 to 255 of A-Z a-z 0-9 _ . -, not {t:?}"
            )));
        }
        if self.prefix.len() > MAX_PREFIX || self.prefix.chars().any(char::is_control) {
            return Err(invalid(format!(
                "prefix must be at most {MAX_PREFIX} bytes without control characters"
            )));
        }
        Ok(())
    }

    /// Checks the settings (an emulator is refused unless volatility is accepted, before any
    /// I/O), then creates the table if it is missing and checks its key schema.
    ///
    /// # Errors
    /// [`StorageError::Config`] for a bad table name or prefix, an emulator without
    /// [`Self::allow_volatile`], missing credentials, a missing table with
    /// `create_table(false)` or a table with another key schema; [`StorageError::Backend`] if
    /// the service cannot be reached or refuses.
    pub async fn open(self) -> Result<DynamoDbStorage, StorageError> {
        self.check()?;
        let durability = Durability::judge(
            NAME,
            self.emulator.then(|| EMULATOR_FORGETS.to_owned()),
            self.allow_volatile,
        )?;
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let region = self
            .region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_owned());
        let credentials = match self.credentials {
            Some(c) => c,
            None => Credentials {
                key_id: env("AWS_ACCESS_KEY_ID")
                    .ok_or_else(|| invalid("no credentials: AWS_ACCESS_KEY_ID is not set"))?,
                secret: env("AWS_SECRET_ACCESS_KEY")
                    .ok_or_else(|| invalid("no credentials: AWS_SECRET_ACCESS_KEY is not set"))?,
                session_token: env("AWS_SESSION_TOKEN"),
            },
        };
        let endpoint = self
            .endpoint
            .unwrap_or_else(|| format!("https://dynamodb.{region}.amazonaws.com"));
        let client = Client::new(&endpoint, &region, credentials, self.timeout)?;
        let storage = DynamoDbStorage {
            inner: Arc::new(Inner {
                client,
                table: self.table,
                prefix: self.prefix,
                seen: Observations::with_clock(self.clock),
                durability,
                no_transactions: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        storage
            .ensure_table(self.create_table, self.timeout.saturating_mul(30))
            .await?;
        Ok(storage)
    }
}

#[async_trait]
impl Storage for DynamoDbStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_time_source(TimeSource::Observed)
            .with_durability(self.inner.durability)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition): one conditional PutItem; otherwise a consistent GetItem first \
                 (2); a fresh key's first acquisition also reads the fencing floor before and \
                 after its create (4)",
            )
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.inner.seen.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let body = json!({ "Key": self.key(key), "ConsistentRead": true });
        let answer = self
            .call("get", "GetItem", body)
            .await?
            .map_err(|r| r.into_error("get"))?;
        match answer.get("Item") {
            None | Some(Value::Null) => {
                self.inner.seen.forget(key);
                Ok(None)
            }
            Some(item) => {
                let (stored_key, stored) = self.decode(item)?;
                if stored_key != key {
                    return Err(StorageError::Corrupt {
                        key: key.to_owned(),
                        reason: "the item names another lock".to_owned(),
                    });
                }
                Ok(Some(stored))
            }
        }
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let wanted = format!("{}{prefix}", self.inner.prefix);
        let mut rows = Vec::new();
        let mut start: Option<Value> = None;
        loop {
            let mut body = json!({ "ConsistentRead": true });
            if !wanted.is_empty() {
                body["FilterExpression"] = json!("begins_with(k, :p)");
                body["ExpressionAttributeValues"] = json!({ ":p": { "S": wanted } });
            }
            if let Some(start) = start.take() {
                body["ExclusiveStartKey"] = start;
            }
            let answer = self
                .call("list", "Scan", body)
                .await?
                .map_err(|r| r.into_error("list"))?;
            for item in answer["Items"].as_array().into_iter().flatten() {
                match self.decode(item) {
                    Ok((key, stored)) => rows.push((key, Ok(stored))),
                    Err(StorageError::Corrupt { key, reason }) => rows.push((key, Err(reason))),
                    Err(e) => return Err(e),
                }
            }
            match answer.get("LastEvaluatedKey") {
                Some(next) if !next.is_null() => start = Some(next.clone()),
                _ => break,
            }
        }
        Ok(Page::from_unsorted_results(rows, prefix, page))
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for DynamoDbStorage {
    fn known(&self, key: &str) -> Option<Stored> {
        self.inner.seen.known(key)
    }

    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let condition = json!({ "ConditionExpression": "attribute_not_exists(k)" });
        self.put("create", key, record, condition, |key| {
            StorageError::already_exists(key)
        })
        .await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let condition = json!({
            "ConditionExpression": "v = :v",
            "ExpressionAttributeValues": expected_version(key, expected)?,
        });
        self.put("update", key, record, condition, |key| {
            StorageError::conflict(key)
        })
        .await
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let body = json!({
            "Key": self.key(key),
            "ConditionExpression": "v = :v",
            "ExpressionAttributeValues": expected_version(key, expected)?,
        });
        match self.call("delete", "DeleteItem", body).await? {
            Ok(_) => {
                self.inner.seen.forget(key);
                Ok(())
            }
            Err(refusal) if refusal.is(CONDITION_FAILED) || refusal.is(TRANSACTION_CONFLICT) => {
                Err(StorageError::conflict(key))
            }
            Err(refusal) => Err(refusal.into_error("delete")),
        }
    }

    fn writes_all_at_once(&self) -> bool {
        !self
            .inner
            .no_transactions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One `TransactWriteItems` of conditional `Put`s (up to [`MAX_TRANSACT_ITEMS`]; more, or
    /// a service that does not know the call, such as dynalite:
    /// [`StorageError::Unsupported`], and the caller takes the keys one by one). A canceled
    /// transaction (a condition failed, or another transaction wrote one of the items) wrote
    /// nothing: a typed conflict.
    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        let Some(first) = writes.first() else {
            return Ok(Vec::new());
        };
        let unsupported = |why: &'static str| StorageError::Unsupported {
            backend: NAME.to_owned(),
            operation: why,
        };
        if writes.len() > MAX_TRANSACT_ITEMS {
            return Err(unsupported(
                "write_all of more items than one transaction takes",
            ));
        }
        let mut items = Vec::with_capacity(writes.len());
        let mut written = Vec::with_capacity(writes.len());
        for w in writes {
            let version: u64 = rand::random_range(1..=u64::MAX);
            let (bytes, wrote) = self.inner.seen.encode(w.record, version);
            let mut item = self.key(w.key);
            item["r"] = json!({ "B": BASE64.encode(bytes) });
            item["v"] = json!({ "N": version.to_string() });
            let mut put = match w.expected {
                None => json!({ "ConditionExpression": "attribute_not_exists(k)" }),
                Some(expected) => json!({
                    "ConditionExpression": "v = :v",
                    "ExpressionAttributeValues": expected_version(w.key, expected)?,
                }),
            };
            put["TableName"] = Value::String(self.inner.table.clone());
            put["Item"] = item;
            items.push(json!({ "Put": put }));
            written.push((Version::from_u64(version), wrote));
        }
        let body = json!({ "TransactItems": items });
        match self
            .inner
            .client
            .call("write_all", "TransactWriteItems", &body)
            .await?
        {
            Ok(_) => Ok(writes
                .iter()
                .zip(written)
                .map(|(w, (version, wrote))| {
                    self.inner.seen.wrote(w.key, &version, wrote);
                    version
                })
                .collect()),
            Err(refusal) if refusal.is("TransactionCanceledException") => {
                let reasons = refusal
                    .body
                    .get("CancellationReasons")
                    .and_then(Value::as_array);
                let refused = reasons.is_none_or(|reasons| {
                    reasons.iter().any(|r| {
                        matches!(
                            r.get("Code").and_then(Value::as_str),
                            Some("ConditionalCheckFailed" | "TransactionConflict")
                        )
                    })
                });
                if refused {
                    Err(StorageError::conflict(first.key))
                } else {
                    Err(refusal.into_error("write_all"))
                }
            }
            Err(refusal) if refusal.is("UnknownOperationException") => {
                self.inner
                    .no_transactions
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Err(unsupported("TransactWriteItems"))
            }
            Err(refusal) => Err(refusal.into_error("write_all")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_before_connecting() {
        let ok = DynamoDbStorageBuilder::from_url(
            "dynamodb://locks/app/?region=eu-west-1&endpoint=http://127.0.0.1:4570\
             &emulator=true&durability=volatile&create=false&timeout=1s",
        )
        .unwrap();
        assert_eq!(ok.table, "locks");
        assert_eq!(ok.prefix, "app/");
        assert_eq!(ok.region.as_deref(), Some("eu-west-1"));
        assert_eq!(ok.endpoint.as_deref(), Some("http://127.0.0.1:4570"));
        assert!(ok.emulator && ok.allow_volatile && !ok.create_table);
        assert_eq!(ok.timeout, Duration::from_secs(1));
        for bad in [
            "s3://locks",
            "dynamodb://ab",
            "dynamodb://has space",
            "dynamodb://a,b",
            "dynamodb://u@locks",
            "dynamodb://locks?bucket=x",
            "dynamodb://locks?emulator=yes",
            "dynamodb://locks?create=1",
            "dynamodb://locks?durability=sometimes",
            "dynamodb://locks?timeout=soon",
        ] {
            let e = DynamoDbStorageBuilder::from_url(bad).unwrap_err();
            assert!(matches!(e, StorageError::Config { .. }), "{bad}: {e:?}");
        }
    }

    /// The key schema, and global tables: refused unless strongly consistent.
    #[test]
    fn only_single_region_tables_keyed_by_k_are_used() {
        let keyed = |extra: Value| {
            let mut t = json!({
                "KeySchema": [{ "AttributeName": "k", "KeyType": "HASH" }],
                "AttributeDefinitions": [{ "AttributeName": "k", "AttributeType": "S" }],
            });
            for (name, value) in extra.as_object().unwrap() {
                t[name] = value.clone();
            }
            t
        };
        assert!(usable_table(&keyed(json!({}))).is_ok());
        assert!(usable_table(&keyed(json!({ "Replicas": [] }))).is_ok());
        let replicas = json!([{ "RegionName": "eu-west-1" }]);
        let global = usable_table(&keyed(json!({ "Replicas": replicas }))).unwrap_err();
        assert!(global.contains("global table"), "{global}");
        let eventual = json!({ "Replicas": replicas, "MultiRegionConsistency": "EVENTUAL" });
        assert!(usable_table(&keyed(eventual)).is_err());
        let strong = json!({ "Replicas": replicas, "MultiRegionConsistency": "STRONG" });
        assert!(usable_table(&keyed(strong)).is_ok());
        let numeric = json!({
            "KeySchema": [{ "AttributeName": "k", "KeyType": "HASH" }],
            "AttributeDefinitions": [{ "AttributeName": "k", "AttributeType": "N" }],
        });
        assert!(usable_table(&numeric).is_err());
        let sorted = keyed(json!({ "KeySchema": [
            { "AttributeName": "k", "KeyType": "HASH" },
            { "AttributeName": "s", "KeyType": "RANGE" },
        ] }));
        assert!(usable_table(&sorted).is_err());
    }

    /// No server needed: the refusal comes before any I/O.
    #[tokio::test]
    async fn an_emulator_is_refused_unless_volatility_is_accepted() {
        let e = DynamoDbStorageBuilder::from_url(
            "dynamodb://locks?endpoint=http://127.0.0.1:1&emulator=true",
        )
        .unwrap()
        .open()
        .await
        .unwrap_err();
        assert!(
            matches!(&e, StorageError::Config { reason, .. } if reason.contains("restart")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_bad_endpoint_is_a_config_error() {
        let e = DynamoDbStorageBuilder::from_url("dynamodb://locks?endpoint=ftp://h")
            .unwrap()
            .credentials(Credentials {
                key_id: "a".to_owned(),
                secret: "b".to_owned(),
                session_token: None,
            })
            .open()
            .await
            .unwrap_err();
        assert!(matches!(e, StorageError::Config { .. }), "{e:?}");
    }
}
