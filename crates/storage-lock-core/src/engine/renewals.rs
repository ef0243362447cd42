//! Coalesced renewals: the watchdogs of all auto-renewed handles of one [`crate::StorageLock`]
//! renew through one batcher, which sends them to the storage as [`Storage::renew_many`] calls
//! of up to [`RENEW_BATCH`] keys.
//!
//! How renewals come to coincide: each watchdog schedules its next renewal on a grid of one
//! eighth of its period, shared by the whole process (see `hold::watchdog::aligned`), so handles with
//! the same period renew at the same instants; the batcher collects what arrives within
//! [`LINGER`] of the first request and sends it in one call. Handles renew at most one eighth of
//! a period early; a renewal waits at most [`LINGER`] for its batch to leave, and then for the
//! slowest key of the call (one round trip on a backend that overrides `renew_many`; the
//! default renews the keys of a call concurrently). There is one batcher per engine and tokio
//! runtime (see `hold::per_runtime`).
//!
//! Every key stays fail-closed on its own: each watchdog waits for its own answer only until its
//! own local deadline, a batch call that fails as a whole fails each of its keys (their
//! watchdogs retry), and a slow batch never holds up the next one (each call runs in a task of
//! its own).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::hold::per_runtime::PerRuntime;
use crate::small_key::SmallKey;
use crate::storage::{OwnerId, RenewOutcome, RenewRequest, Storage, StorageError};

/// The most keys one [`Storage::renew_many`] call of the watchdog carries.
pub const RENEW_BATCH: usize = 128;

/// How long the batcher waits after the first renewal of a batch for others due at the same
/// instant (their timers fire in the same tick, but their tasks run one after another).
const LINGER: Duration = Duration::from_millis(2);

type Reply = oneshot::Sender<Result<RenewOutcome, StorageError>>;

struct Job {
    key: SmallKey,
    owner: OwnerId,
    lease: Duration,
    reply: Reply,
}

/// The sending side of an engine's batchers (one per runtime); a batcher task starts with the
/// first renewal on its runtime and ends when the engine and all its handles are gone.
#[derive(Default)]
pub(crate) struct Renewals {
    batchers: PerRuntime<Job>,
}

impl Renewals {
    /// Renews `owner`'s hold of `key` in the next batch.
    pub(crate) async fn renew<S: Storage + ?Sized>(
        &self,
        storage: &Arc<S>,
        key: &SmallKey,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let (reply, answer) = oneshot::channel();
        self.send(
            storage,
            Job {
                key: key.clone(),
                owner,
                lease,
                reply,
            },
        );
        answer.await.unwrap_or_else(|_| {
            // The batcher's runtime shut down with this renewal in it: the outcome is unknown.
            Err(StorageError::backend(
                storage.name(),
                "renew",
                "the renewal batch was dropped",
            ))
        })
    }

    fn send<S: Storage + ?Sized>(&self, storage: &Arc<S>, job: Job) {
        self.batchers
            .send(job, |_, rx| batcher(storage.clone(), rx));
    }
}

async fn batcher<S: Storage + ?Sized>(storage: Arc<S>, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut jobs = Vec::with_capacity(RENEW_BATCH);
    while rx.recv_many(&mut jobs, RENEW_BATCH).await > 0 {
        if jobs.len() < RENEW_BATCH {
            tokio::time::sleep(LINGER).await;
            // Only what is queued already: never waits.
            while jobs.len() < RENEW_BATCH {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
        }
        let batch = std::mem::replace(&mut jobs, Vec::with_capacity(RENEW_BATCH));
        tokio::spawn(run(storage.clone(), batch));
    }
}

async fn run<S: Storage + ?Sized>(storage: Arc<S>, jobs: Vec<Job>) {
    // Renewals whose watchdog stopped waiting (deadline passed, handle released) are dropped.
    let jobs: Vec<Job> = jobs.into_iter().filter(|j| !j.reply.is_closed()).collect();
    if jobs.is_empty() {
        return;
    }
    let requests: Vec<RenewRequest<'_>> = jobs
        .iter()
        .map(|j| RenewRequest {
            key: j.key.as_str(),
            owner: j.owner,
            lease: j.lease,
        })
        .collect();
    let answers = storage.renew_many(&requests).await;
    drop(requests);
    let why = match answers {
        Ok(answers) if answers.len() == jobs.len() => {
            for (job, answer) in jobs.into_iter().zip(answers) {
                let _ = job.reply.send(answer);
            }
            return;
        }
        Ok(answers) => format!(
            "renew_many answered {} of {} keys",
            answers.len(),
            jobs.len()
        ),
        Err(e) => e.to_string(),
    };
    // The call as a whole failed: every key's outcome is unknown.
    for job in jobs {
        let _ = job.reply.send(Err(StorageError::backend(
            storage.name(),
            "renew",
            why.clone(),
        )));
    }
}
