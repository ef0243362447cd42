//! The two suites every storage-lock backend runs, and the tools they check with.
//!
//! * [`conformance`] — the storage layer: CRUD, negative CAS (duplicate create, stale
//!   update/delete), racing writers with exactly one winner, tombstones, listing, clock, the lock
//!   operations' rules, fencing floor and sweep.
//! * [`semantics`] — the lock contract: every row of the semantics matrix, reentrancy, lease
//!   expiry, watchdog, contention under an [`OverlapDetector`], fencing monotonicity across
//!   release/expiry/sweep, cancel safety, the lost signal, hand-off on release.
//! * [`kinds`] — the lock kinds: multi-locks (deadlock-free in any order, all or nothing, lost
//!   with any part, cancel safe) and semaphores (the N bound under an overlap detector per
//!   slot, crashed holders' permits coming back, the limit record, k permits at once, cancel
//!   safe), leader election
//!   (terms rising and observed in order, a cut-off leader lost before its seat is vacant).
//! * [`cluster`] — clients of a replicated store contending while members fail.
//! * [`multiprocess`] — OS processes contending on one storage, checked through shared files.
//! * [`proxy`] — a loopback TCP proxy that cuts connections, for connection-loss tests.
//! * [`restart`] — a server process of the test's own, killed and restarted, and the check that
//!   holds and fencing tokens come through it.
//! * [`tls`] — a CA, server and client certificates made at test time.
//!
//! Every case is a `pub async fn` taking a fresh storage. A backend stamps all of them as named
//! `#[tokio::test]`s with one macro call, once through its own lock operations and once through
//! the default implementations ([`storage_lock_core::fault::PrimitivesOnly`]); a backend with
//! only the primitives runs them once (`storage_lock_suites!(storage, lock_operations = default)`):
//!
//! ```ignore
//! async fn storage() -> MyStorage { MyStorage::connect("…").await.unwrap() }
//! storage_lock_testkit::storage_lock_suites!(storage);
//! ```

pub mod cluster;
pub mod conformance;
pub mod kinds;
pub mod multiprocess;
pub mod overlap;
pub mod proxy;
pub mod restart;
pub mod semantics;
pub mod tls;

pub use overlap::OverlapDetector;

/// A key prefix no other test uses, so suites can share one database.
pub fn unique_prefix(test: &str) -> String {
    format!("t{:016x}/{test}/", rand::random::<u64>())
}

/// The compare-and-set primitives of `s`, for cases that write records directly.
///
/// # Panics
/// If the storage has none (a lock server's client: its suite leaves those cases out).
pub fn cas<S: storage_lock_core::Storage + ?Sized>(s: &S) -> &dyn storage_lock_core::Primitives {
    s.primitives()
        .expect("the storage has compare-and-set primitives")
}

/// Stamps every case of both suites as `#[tokio::test]`s for the storage made by `$factory`
/// (a path to an `async fn() -> impl Storage`), in two modules: `overrides` (the backend as it
/// is) and `defaults` (only its primitives, so the default lock operations run).
///
/// A backend that implements only the primitives (its lock operations *are* the defaults)
/// says so with `storage_lock_suites!(factory, lock_operations = default)`: the cases run once,
/// in a module `suites`, instead of twice through the same code.
#[macro_export]
macro_rules! storage_lock_suites {
    ($factory:path, lock_operations = default) => {
        /// The suites against the backend (its lock operations are the default ones).
        mod suites {
            #[allow(unused_imports)]
            use super::*;
            $crate::__cases!($crate::__stamp, { $factory().await }, all);
        }
    };
    ($factory:path) => {
        /// The suites against the backend's own lock operations.
        mod overrides {
            #[allow(unused_imports)]
            use super::*;
            $crate::__cases!($crate::__stamp, { $factory().await }, all);
        }
        /// The suites against the default lock operations built on the backend's primitives.
        mod defaults {
            #[allow(unused_imports)]
            use super::*;
            $crate::__cases!(
                $crate::__stamp,
                { $crate::__core::fault::PrimitivesOnly($factory().await) },
                all
            );
        }
    };
}

/// Stamps the lock semantics suite for a **remote** storage (a client of a lock server, made by
/// `$factory`), in a module `remote`. The storage conformance suite does not apply: a server
/// exposes lock operations, not raw compare-and-set. Of the semantics cases, those listed as
/// needing the storage itself (`local:` in the one case list) are left out: reentrant holds,
/// records written through the primitives, the engine's own batching and loss watch (the
/// fencing case runs without its sweeps: the remote storage has no conditional delete);
/// everything a [`storage_lock_core::DistributedLock`] promises is in.
#[macro_export]
macro_rules! storage_lock_remote_suite {
    ($factory:path) => {
        /// The lock semantics suite through a lock server.
        mod remote {
            #[allow(unused_imports)]
            use super::*;
            $crate::__cases!($crate::__stamp, { $factory().await }, remote);
        }
    };
}

#[doc(hidden)]
pub use storage_lock_core as __core;

#[doc(hidden)]
#[macro_export]
macro_rules! __stamp {
    ($make:block; $($suite:ident: [$($case:ident),* $(,)?]);* $(;)?) => {$(
        mod $suite {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    $crate::$suite::$case($make).await;
                }
            )*
        }
    )*};
}

/// The list of cases, in one place; `$cb` is called with the cases `$which` selects: `all`
/// (both suites, for a storage) or `remote` (the semantics cases that run through a lock
/// server: `shared`, not `local`).
#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($cb:path, $make:block, $which:ident) => {
        $crate::__cases! { @pick $cb, $make, $which;
            conformance: [
                create_then_get,
                create_duplicate_is_already_exists,
                stale_update_is_conflict,
                stale_delete_is_conflict,
                racing_creates_have_one_winner,
                racing_updates_have_one_winner,
                racing_acquires_have_one_winner,
                acquire_many_takes_every_key_or_none,
                acquire_any_takes_the_first_free_keys_or_none,
                acquire_any_with_a_gate_takes_nothing_while_the_gate_is_held,
                write_all_is_all_or_nothing,
                release_writes_tombstone,
                list_by_prefix_in_pages,
                clock_is_sane,
                renew_requires_owner_and_live_hold,
                renew_many_decides_each_key_on_its_own,
                expired_hold_is_taken_over_with_next_token,
                reentrant_acquire_counts_levels,
                busy_reports_holder_and_expiry,
                fresh_keys_start_above_floor,
                sweep_keeps_fencing_monotonic,
                sweeps_racing_acquisitions_keep_tokens_increasing,
                force_release_frees_a_held_key_and_keeps_fencing,
                keys_differing_by_padding_case_or_normalization_are_distinct,
                list_with_page_size_zero_makes_progress,
                declared_change_notifications_are_delivered,
                force_release_wakes_waiters,
            ];
            shared: [
                matrix_busy_until_wait_runs_out_returns_none,
                matrix_cancelled_wait_leaves_holder_intact,
                matrix_blank_name_rejected_before_storage,
                matrix_invalid_options_rejected_before_storage,
                matrix_lease_expiry_marks_handle_lost,
                matrix_renewal_failure_is_fail_closed,
                matrix_double_release_is_idempotent,
                matrix_fencing_strictly_increasing_across_release_expiry_and_sweep,
                matrix_same_key_twice_is_not_reentrant,
                checklist_provider_info_reports_process_locality,
                checklist_different_keys_do_not_block,
                checklist_released_handle_renew_returns_lost_without_state_change,
                checklist_failure_after_grant_releases_first,
                checklist_expires_at_is_storage_clock_plus_lease,
                checklist_unsafe_storage_is_refused,
                watchdog_keeps_lock_past_several_leases,
                watchdog_outage_turns_handle_lost_by_local_deadline,
                mutual_exclusion_under_contention,
                cancel_safety_dropped_acquires_leave_no_holder,
                cancelled_release_still_releases,
                handoff_on_release,
                waiter_acquires_when_holder_expires,
                dropped_handle_releases_in_background,
                events_are_emitted,
                waiting_acquire_rides_out_a_storage_outage,
                grant_after_storage_errors_keeps_its_full_lease,
                grant_with_a_lost_answer_is_adopted,
                huge_leases_work_or_fail_typed_without_holding,
            ];
            local: [
                watchdog_batches_renewals_of_many_holds,
                reentrant_counts_levels_and_keeps_token,
                a_broken_hold_is_lost_at_once_and_release_says_so,
                fencing_tokens_stop_well_before_the_storage_bound,
            ];
            kinds_shared: [
                multi_lock_in_any_order_neither_deadlocks_nor_overlaps,
                multi_lock_is_all_or_nothing,
                multi_lock_is_lost_when_a_part_is_lost,
                multi_lock_dropped_acquisitions_leave_nothing_held,
                election_terms_rise_and_observers_see_them_in_order,
                fair_lock_serves_waiters_in_arrival_order,
                fair_lock_nobody_jumps_the_queue,
                fair_lock_a_dead_waiter_loses_its_place_with_its_lease,
                fair_lock_dropped_acquisitions_leave_nothing_held,
                fair_lock_bad_input_is_refused,
                semaphore_admits_at_most_its_permits,
                semaphore_permit_of_a_crashed_holder_comes_back,
                semaphore_with_another_limit_is_refused,
                semaphore_takes_k_permits_all_or_nothing,
                semaphore_dropped_acquisitions_leave_no_permit_out,
                rwlock_readers_never_see_a_write_and_writers_exclude_each_other,
                rwlock_a_waiting_writer_keeps_new_readers_out,
                rwlock_a_crashed_writer_or_reader_lapses_with_its_lease,
                rwlock_dropped_acquisitions_leave_nothing_held,
                rwlock_bad_input_and_another_max_readers_are_refused,
                rwlock_fifo_serves_readers_and_writers_in_arrival_order,
            ];
            kinds_local: [
                election_a_cut_off_leader_loses_before_the_seat_is_vacant,
            ];
        }
    };
    (@pick $cb:path, $make:block, all; conformance: [$($c:ident),* $(,)?]; shared: [$($s:ident),* $(,)?]; local: [$($l:ident),* $(,)?]; kinds_shared: [$($ks:ident),* $(,)?]; kinds_local: [$($kl:ident),* $(,)?];) => {
        $cb! { $make; conformance: [$($c),*]; semantics: [$($s,)* $($l),*]; kinds: [$($ks,)* $($kl),*]; }
    };
    (@pick $cb:path, $make:block, remote; conformance: [$($c:ident),* $(,)?]; shared: [$($s:ident),* $(,)?]; local: [$($l:ident),* $(,)?]; kinds_shared: [$($ks:ident),* $(,)?]; kinds_local: [$($kl:ident),* $(,)?];) => {
        $cb! { $make; semantics: [$($s),*]; kinds: [$($ks),*]; }
    };
}
