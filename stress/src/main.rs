//! `soak`: a long, mixed, multi-threaded training-like load on real
//! `dynemb::Variable`s that checks exact invariants as it goes.
//!
//! ```text
//! cargo run --release -p dynemb-stress --bin soak -- --duration 30m [--threads N] [--dim D]
//!     [--dir PATH] [--keys N] [--shards S] [--batch B] [--policy frequency|timestamp]
//!     [--checkpoint-every D] [--audit-every D] [--progress-every D] [--ledger-keys N]
//!     [--seed S] [--max-rss-gib G] [--keep-checkpoints] [--capacity N] [--expire-every D]
//! ```
//!
//! It is not part of `cargo test`: run it by hand, for minutes or hours.
//! It prints a progress line every `--progress-every` (10 s) and a summary
//! at the end, and exits 0 only if no invariant was violated. The first
//! violation prints a precise message (which key, which row, what was
//! expected) and the counters so far, and exits 1; a panic exits 101; a
//! flag error 2.
//!
//! # The load
//!
//! Two variables, both with `init_size(1)` so they grow by many resizes:
//!
//! - **main** (`--shards` shards, a `--policy` restrict policy, one slot
//!   `m`): `--threads` workers run batches of `lookup_or_insert`, `lookup`,
//!   `lookup_slot`, `update_rows` with the slot (an optimizer step),
//!   `lookup_with_exists` + `accum` (`bp_v2`) and `remove`. It first grows to
//!   `--keys` keys (3M by default), then churns: new keys keep arriving,
//!   `remove` drops old ones, and whenever its size passes 1.1 `--keys` a
//!   worker runs `restrict` down to 0.9 `--keys`;
//! - **ledger** (no restrict policy, nothing ever removes a key, one slot
//!   `acc`): workers add small positive integer gradients to `2 *
//!   --ledger-keys` keys, half by `update_rows` (value `+= g`, slot `+= 2g`),
//!   half by `accum` (the keys inserted up front, `exists = true`), with
//!   repeated keys in a batch, and read them back.
//!
//! A checkpoint thread saves both variables every `--checkpoint-every` (to
//! `--dir`/main and `--dir`/ledger, overwriting) while the workers train,
//! restores each checkpoint into a second variable (the main one with
//! another shard count) and loads the main one again on top. A server
//! thread restores both checkpoints into variables of its own each time a
//! save of them starts, so restores and saves of one directory overlap
//! (dynemb's lock file makes the restore read one whole checkpoint). The
//! main thread samples sizes and memory every 50 ms, prints progress, and
//! every
//! `--audit-every` pauses the workers for a whole-table audit. At the end
//! the workers stop, a last audit runs (the workers' own ledger records
//! compared with the table), then a last checkpoint round, which the server
//! restores during its saves too. The first round starts one
//! `--checkpoint-every` after the start: give short runs a short one.
//!
//! # The invariants, and why each must hold exactly
//!
//! 1. **No update lost** (ledger). For each ledger index the books keep
//!    `started` (raised before a call that adds `g`) and `done` (raised
//!    after it returned); each worker also keeps its own sum. Gradients are
//!    positive integers, so a row only grows and its f32 sums are exact
//!    (kept below 2^22). Hence at any moment `done <= value <= started`,
//!    and every worker read checks `done (read before) <= value <= started
//!    (read after)`; an update slot must read `2 * value <= slot <= 2 *
//!    started` (read after the value). In an audit, with nothing in flight,
//!    `value == done == started` exactly and `slot == 2 * value`; at the end
//!    also `done == the sum of every worker's own records`. Inside every
//!    ledger `update_rows` the row lock gives one version: `slot == 2 *
//!    value` exactly.
//! 2. **No torn row** (main). Every row the soak writes is uniform (all
//!    `dim` values equal, and all slot values equal) and its value and slot
//!    form a valid pair for its key (see the `rows` module): untagged `v =
//!    P*Q*a, s = 0` (fresh plus `accum`s) or tagged `v = t + P*(u + Q*a), s =
//!    t + P*u` with `t` the key's tag (after an `update_rows` step). Every
//!    operation maps a valid pair to a valid pair, so any other state is a
//!    torn row, a row or slot of another key, or a stale slot in a reused
//!    row. Checked: each column on every worker read (`lookup`,
//!    `lookup_or_insert`, `lookup_with_exists`, `lookup_slot`; a missing key
//!    must read the initializer's 0), the whole pair inside every
//!    `update_rows` (under the row lock), in every audit, and in every row of
//!    every restored checkpoint.
//! 3. **Checkpoints.** Every save returns `Ok` and then every restore and
//!    load of it returns `Ok`. Restored rows satisfy (2) and have a non-zero
//!    score; restored ledger rows lie between the ledger's `done` at save
//!    start and `started` at save end (for monotone sums, every value the
//!    row had during the save is in that range), with `slot == 2 * value`
//!    (one version of the row), and its marker keys read the round just
//!    saved (no other save ran meanwhile). Keys present for the whole save are in the
//!    restore: every ledger key inserted before the save (nothing removes
//!    them); and, on every other ("strict") round, every main key exported
//!    just before the save, because those rounds hold `remove` and
//!    `restrict` off until the save ends. Loading the checkpoint into the
//!    variable just restored from it changes nothing (same size and
//!    checksum of keys, values, slots and scores). A restore that starts
//!    while a save of the same directory runs reads one whole checkpoint:
//!    the ledger's marker keys (one per shard, set to the round number
//!    before each save) all name the same saved round, and its rows lie
//!    between that round's `done` at save start and `started` after the
//!    restore; its main rows satisfy (2) and (4).
//! 4. **Size bookkeeping.** With nothing in flight (audits, restored
//!    variables), `size()` equals the number of keys `export` gives, no key
//!    is exported twice, and each `shard_size(s)` equals the number of
//!    exported keys the partitioner sends to `s`.
//!
//! Resizes are not visible through the public API (no capacity); the
//! summary counts shards reaching a new power-of-two size instead (see the
//! `stats` module). `Variable::remove` does not return how many keys it
//! removed, so the summary gives keys passed to `remove` and rows removed by
//! `restrict`. Memory: the main variable and its two restored copies hold
//! about 3 * 1.1 `--keys` rows (more while a restrict is held off by a
//! strict save or outpaced by inserts: the summary shows the largest size);
//! the run fails if RSS passes `--max-rss-gib`.

mod audit;
mod bounded;
mod checkpoints;
mod cli;
mod rows;
mod server;
mod shared;
mod stats;
mod worker;

use clap::Parser;
use cli::Options;
use shared::Shared;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let options = Options::parse();
    // A panic in any thread (the soak's or dynemb's) fails the run at once.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("soak: a thread panicked: failing the run");
        std::process::exit(101);
    }));
    if let Err(e) = std::fs::create_dir_all(&options.dir) {
        eprintln!("soak: cannot create {}: {e}", options.dir.display());
        return ExitCode::FAILURE;
    }
    print_plan(&options);
    let shared = Shared::new(options);
    let restored = checkpoints::Restored::new(&shared);
    run(&shared, &restored);
    if !shared.options.keep_checkpoints {
        restored.remove_checkpoints();
    }
    ExitCode::SUCCESS
}

/// Prints what the run will do.
fn print_plan(options: &Options) {
    println!(
        "soak: {:?} on {} worker threads; main: dim {}, {} shards, {:?} policy, grows to {} \
         keys then churns in [{}, {}]; ledger: 2 x {} keys; batches of {}; checkpoints every \
         {:?} in {}; audits every {:?}",
        options.duration,
        options.threads,
        options.dim,
        options.shards,
        options.policy,
        options.keys,
        options.keys - options.keys / 10,
        options.keys + options.keys / 10,
        options.ledger_keys,
        options.batch,
        options.checkpoint_every,
        options.dir.display(),
        options.audit_every,
    );
    if let Some(capacity) = options.capacity {
        println!(
            "soak: bounded variable: capacity {capacity}, eviction listener, Timestamp policy, \
             expire every {:?}",
            options.expire_every
        );
    }
}

/// Runs the load, the checkpoint thread and the monitor; then the final
/// audit, checkpoint round and summary.
fn run(shared: &Shared, restored: &checkpoints::Restored) {
    let elapsed = std::thread::scope(|s| {
        let workers: Vec<_> = (0..shared.options.threads)
            .map(|i| s.spawn(move || worker::run(shared, i)))
            .collect();
        let checkpointer = s.spawn(|| checkpoints::run(shared, restored));
        let server = s.spawn(|| server::run(shared, restored));
        monitor(shared);
        shared.stop.store(true, Ordering::Relaxed);
        let locals: Vec<Vec<u64>> = workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| shared.violation("a worker panicked"))
            })
            .collect();
        checkpointer
            .join()
            .unwrap_or_else(|_| shared.violation("the checkpoint thread panicked"));
        let elapsed = shared.started.elapsed();
        println!(
            "[{:>7.1}s] workers stopped; final audit",
            elapsed.as_secs_f64()
        );
        let sums = worker::sum_locals(&locals);
        audit::run(shared, Some(&sums));
        println!(
            "[{:>7.1}s] final checkpoint round (strict; the server restores during its saves)",
            shared.started.elapsed().as_secs_f64()
        );
        checkpoints::run_round(shared, restored, true);
        shared.stop_server.store(true, Ordering::Relaxed);
        server
            .join()
            .unwrap_or_else(|_| shared.violation("the server thread panicked"));
        elapsed
    });
    sample(shared);
    println!("\nsummary");
    println!("{}", shared.stats.summary(elapsed, 0));
    if let Some(bounded) = &shared.bounded {
        println!(
            "{} (keys written {}, read {}; the books balanced in every audit)",
            bounded.describe(),
            bounded.keys_written.load(Ordering::Relaxed),
            bounded.keys_read.load(Ordering::Relaxed)
        );
    }
}

/// Samples every 50 ms, prints progress, runs audits, until the duration
/// has passed.
fn monitor(shared: &Shared) {
    let options = &shared.options;
    let end = shared.started + options.duration;
    let mut next_progress = shared.started + options.progress_every;
    let mut next_audit = shared.started + options.audit_every;
    let mut next_expire = shared.started + options.expire_every;
    let mut last = (shared.started, shared.stats.totals());
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        sample(shared);
        if let Some(bounded) = &shared.bounded {
            if now >= next_expire {
                bounded.expire(shared);
                next_expire = Instant::now() + options.expire_every;
            }
        }
        if now >= next_audit {
            let paused = shared.pause_workers();
            let audit_started = Instant::now();
            audit::run(shared, None);
            let keys = shared.main.size();
            drop(paused);
            println!(
                "[{:>7.1}s] audit passed ({:.2} s, workers paused, main {keys} keys, ledger exact)",
                shared.started.elapsed().as_secs_f64(),
                audit_started.elapsed().as_secs_f64(),
            );
            next_audit = Instant::now() + options.audit_every;
        }
        if now >= next_progress {
            let totals = shared.stats.totals();
            let rate = (totals.all_keys() - last.1.all_keys()) as f64
                / now.duration_since(last.0).as_secs_f64().max(1e-9);
            progress(shared, rate);
            last = (now, totals);
            next_progress += options.progress_every;
        }
        std::thread::sleep(Duration::from_millis(50).min(end.saturating_duration_since(now)));
    }
}

/// One sample of sizes and memory; fails the run past `--max-rss-gib`.
fn sample(shared: &Shared) {
    let var = &shared.main;
    let sizes: Vec<usize> = (0..var.num_shards())
        .map(|s| shared.ok("shard_size", var.shard_size(s)))
        .collect();
    let rss = rss_bytes();
    shared.stats.sample(&sizes, var.memory_bytes(), rss);
    if let Some(rss) = rss {
        let limit = shared.options.max_rss_gib * (1u64 << 30) as f64;
        if rss as f64 > limit {
            shared.violation(format!(
                "memory bound: RSS is {:.2} GiB, above --max-rss-gib {} (main variable {} keys, \
                 {:.2} GiB by memory_bytes)",
                rss as f64 / (1u64 << 30) as f64,
                shared.options.max_rss_gib,
                var.size(),
                var.memory_bytes() as f64 / (1u64 << 30) as f64
            ));
        }
    }
}

/// Prints one progress line (`keys_per_second` over all operations since
/// the previous line).
fn progress(shared: &Shared, keys_per_second: f64) {
    let stats = &shared.stats;
    let phase = if shared.grown.load(Ordering::Relaxed) {
        "churn"
    } else {
        "grow "
    };
    println!(
        "[{:>7.1}s] {phase} size {:>9} (max {:>9})  ledger {:>7}  {:>6.2} M keys/s  \
         mem {:>6.0} MiB  rss {:>6.0} MiB  resizes~{}  saves {}  restores {}+{} during saves  \
         loads {}  restricts {} (-{} rows)  audits {}  violations 0",
        shared.started.elapsed().as_secs_f64(),
        shared.main.size(),
        stats.max_size.load(Ordering::Relaxed),
        shared.ledger.var.size(),
        keys_per_second / 1e6,
        shared.main.memory_bytes() as f64 / (1 << 20) as f64,
        rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64,
        stats.inferred_resizes.load(Ordering::Relaxed),
        stats.saves.count.load(Ordering::Relaxed),
        stats.restores.count.load(Ordering::Relaxed),
        stats.served_restores.count.load(Ordering::Relaxed),
        stats.loads.count.load(Ordering::Relaxed),
        stats.restricts.count.load(Ordering::Relaxed),
        stats.restrict_removed.load(Ordering::Relaxed),
        stats.audits.count.load(Ordering::Relaxed),
    );
    if let Some(bounded) = &shared.bounded {
        println!("           {}", bounded.describe());
    }
}

/// Resident set size of this process in bytes (`VmRSS` of
/// `/proc/self/status`), or `None` where that file does not exist.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
