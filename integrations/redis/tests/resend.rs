//! Writes whose reply is lost are resent by the client and applied once.
//!
//! The server is frozen (SIGSTOP) with a write in flight, for longer than
//! the command timeout: the client's first wait times out, it resends the
//! write on a new connection, and when the server is thawed it runs both
//! (the first, then the resend). Each write records its reply on the
//! server, so the resend applies nothing and returns the first run's
//! reply: sums are exact, scores count one write, and an Adam step with
//! its slots equals the same steps on a local `Variable`. The servers'
//! command counts show the resend really ran. Each test runs under both
//! forms of the writes (`dynemb-redis-module`'s commands, Lua scripts).

use dynemb::{EmbeddingStore, Initializer, RestrictPolicy, SlotId, Variable};
use dynemb_optim::{ParamsAdam, SparseAdam, SparseOptimizer};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{command_calls, module_calls, Form, Server};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

const DIM: usize = 4;
const BUCKETS: u32 = 8;
/// The first wait for a reply; the server stays frozen for longer, and is
/// thawed well before the batch's deadline (twice this). The margins on
/// both sides (1.5 s) leave room for a loaded machine: the write must
/// start waiting within them of the freeze for its first wait to time out.
const COMMAND: Duration = Duration::from_secs(3);
const FROZEN: Duration = Duration::from_millis(4500);

/// Held by each test for its whole run, so the tests of this file run one
/// at a time: a write must start waiting within the margins above of its
/// server's freeze, which other tests' servers and threads starting and
/// stopping on the same cores can delay past them.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Takes [`ONE_AT_A_TIME`] (a test that failed while holding it does not
/// stop the others).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn config(server: &Server, form: Form) -> RedisConfig {
    form.config(RedisConfig {
        command_timeout: COMMAND,
        buckets: BUCKETS,
        ..server.config()
    })
}

/// Bucket writes the server has run: `EVALSHA` calls (scripts' writes and
/// reads) and the module's commands (`dynemb.*`).
fn write_calls(server: &Server) -> u64 {
    command_calls(server, |name| {
        name == "evalsha" || name.starts_with("dynemb.")
    })
}

/// Runs `write` once with the server running, then again with the server
/// frozen for [`FROZEN`] from just before it; returns both results and
/// asserts that the second one's scripts ran twice (sent, then resent).
fn normal_then_frozen<T>(server: &Server, mut write: impl FnMut() -> T) -> (T, T) {
    let start = write_calls(server);
    let normal = write();
    let normal_calls = write_calls(server) - start;
    assert!(normal_calls > 0, "the write runs scripts");
    let start = write_calls(server);
    server.pause();
    let thaw = server.resume_after(FROZEN);
    let frozen = write();
    thaw.join().unwrap();
    let frozen_calls = write_calls(server) - start;
    assert_eq!(
        frozen_calls,
        2 * normal_calls,
        "the frozen write was resent once"
    );
    (normal, frozen)
}

fn scores(var: &RedisVariable<i64>, keys: &[i64]) -> Vec<u64> {
    let mut out = vec![0; keys.len()];
    var.lookup_scores(keys, &mut out).unwrap();
    out
}

#[test]
fn a_resent_accum_upsert_or_insert_is_applied_once_by_the_module() {
    let _serial = one_at_a_time();
    resent_accum_upsert_or_insert(Form::Module);
}

#[test]
fn a_resent_accum_upsert_or_insert_is_applied_once_by_the_scripts() {
    let _serial = one_at_a_time();
    resent_accum_upsert_or_insert(Form::Lua);
}

fn resent_accum_upsert_or_insert(form: Form) {
    let Some(server) = Server::start() else {
        return;
    };
    if !form.is_available() {
        return;
    }
    let var = RedisVariable::open(
        Variable::<i64>::builder("emb")
            .dim(DIM)
            .initializer(Initializer::Constant(0.5))
            .restrict_policy(RestrictPolicy::Frequency),
        config(&server, form),
    )
    .unwrap();
    assert_eq!(var.uses_module(), form == Form::Module);
    let keys: Vec<i64> = (0..200).collect();
    let n = keys.len();

    // Inserts: the frozen part is the read before them (the inserts go
    // after the thaw); the rows are the initializer's, counted once.
    let mut rows = vec![0.0; n * DIM];
    server.pause();
    let thaw = server.resume_after(FROZEN);
    var.lookup_or_insert(&keys, &mut rows).unwrap();
    thaw.join().unwrap();
    assert_eq!(rows, vec![0.5; n * DIM]);
    assert_eq!(scores(&var, &keys), vec![1; n], "one insert each");

    // Accumulations of integers: exact sums, one write each.
    let deltas: Vec<f32> = (0..n * DIM).map(|i| (i % 7) as f32).collect();
    let exists = vec![true; n];
    let (first, second) = normal_then_frozen(&server, || var.accum(&keys, &deltas, &exists));
    first.unwrap();
    second.unwrap();
    let mut rows = vec![0.0; n * DIM];
    var.lookup(&keys, &mut rows).unwrap();
    let expected: Vec<f32> = deltas.iter().map(|d| 0.5 + 2.0 * d).collect();
    assert_eq!(rows, expected, "each accum added once");
    assert_eq!(scores(&var, &keys), vec![3; n]);

    // An accum that overflows one row: the resend reports the first run's
    // refusal (its recorded reply), and changes nothing more.
    var.upsert(&[0], &[3e38; DIM]).unwrap();
    let big = vec![3e38_f32; DIM];
    let (first, second) = normal_then_frozen(&server, || {
        var.accum(&[5, 0], &[[1.0; DIM], [3e38; DIM]].concat(), &[true, true])
    });
    for err in [first.unwrap_err(), second.unwrap_err()] {
        assert!(
            matches!(
                err,
                dynemb::Error::NonFinite {
                    what: "accum result",
                    index: 1,
                    ..
                }
            ),
            "{err}"
        );
    }
    let mut row = vec![0.0; DIM];
    var.lookup(&[0], &mut row).unwrap();
    assert_eq!(row, big, "the refused row is unchanged");
    var.lookup(&[5], &mut row).unwrap();
    assert_eq!(
        row,
        expected[5 * DIM..6 * DIM]
            .iter()
            .map(|v| v + 2.0)
            .collect::<Vec<_>>()
    );

    // Upserts: the values, each counted once per call.
    let values: Vec<f32> = (0..n * DIM).map(|i| i as f32).collect();
    let (first, second) = normal_then_frozen(&server, || var.upsert(&keys, &values));
    first.unwrap();
    second.unwrap();
    var.lookup(&keys, &mut rows).unwrap();
    assert_eq!(rows, values);
    let mut counted = vec![5; n];
    counted[0] = 6; // the upsert of the overflow setup
    counted[5] = 7; // two accums more
    assert_eq!(scores(&var, &keys), counted);

    // Removal: a resend does not remove what was written meanwhile (here
    // nothing is; the rows are gone once).
    let (first, second) = normal_then_frozen(&server, || var.remove(&keys[..10]));
    first.unwrap();
    second.unwrap();
    assert_eq!(var.size().unwrap(), n - 10);
    assert_eq!(
        module_calls([&server]) > 0,
        form == Form::Module,
        "the writes ran in the {form:?} form"
    );
}

/// A Redis variable whose `update_rows` freezes its server once, after
/// the rows were read and before they are written back (from inside the
/// update, which runs between the two): the write-back is the write whose
/// reply gets lost.
struct FreezeBeforeWriteBack<'a> {
    var: &'a RedisVariable<i64>,
    server: &'a Server,
    armed: AtomicBool,
    thaw: Mutex<Option<JoinHandle<()>>>,
}

impl EmbeddingStore for FreezeBeforeWriteBack<'_> {
    type Key = i64;
    fn name(&self) -> &str {
        self.var.name()
    }
    fn store_id(&self) -> u64 {
        self.var.store_id()
    }
    fn dim(&self) -> usize {
        self.var.dim()
    }
    fn trainable(&self) -> bool {
        self.var.trainable()
    }
    fn lookup(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
        self.var.lookup(keys, out)
    }
    fn lookup_or_insert(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
        self.var.lookup_or_insert(keys, out)
    }
    fn create_slot(&self, name: &str, initial: f32) -> dynemb::Result<SlotId> {
        self.var.create_slot(name, initial)
    }
    fn slot_id(&self, name: &str) -> dynemb::Result<SlotId> {
        self.var.slot_id(name)
    }
    fn slot_initial(&self, slot: SlotId) -> dynemb::Result<f32> {
        self.var.slot_initial(slot)
    }
    fn lookup_slot(&self, slot: SlotId, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
        self.var.lookup_slot(slot, keys, out)
    }
    fn update_rows<F>(&self, keys: &[i64], slots: &[SlotId], mut update: F) -> dynemb::Result<()>
    where
        F: FnMut(usize, &mut [f32], &mut [f32]),
    {
        self.var.update_rows(keys, slots, |i, values, slot_rows| {
            if self.armed.swap(false, Ordering::SeqCst) {
                self.server.pause();
                *self.thaw.lock().unwrap() = Some(self.server.resume_after(FROZEN));
            }
            update(i, values, slot_rows)
        })
    }
}

fn rows_and_slots<S: EmbeddingStore<Key = i64>>(store: &S, keys: &[i64]) -> Vec<Vec<f32>> {
    let mut rows = vec![0.0; keys.len() * DIM];
    store.lookup(keys, &mut rows).unwrap();
    let mut out = vec![rows];
    for slot in ["m", "v"] {
        let mut part = vec![0.0; keys.len() * DIM];
        store
            .lookup_slot(store.slot_id(slot).unwrap(), keys, &mut part)
            .unwrap();
        out.push(part);
    }
    out
}

#[test]
fn a_resent_adam_step_is_applied_once_by_the_module() {
    let _serial = one_at_a_time();
    resent_adam_step(Form::Module);
}

#[test]
fn a_resent_adam_step_is_applied_once_by_the_scripts() {
    let _serial = one_at_a_time();
    resent_adam_step(Form::Lua);
}

fn resent_adam_step(form: Form) {
    let Some(server) = Server::start() else {
        return;
    };
    if !form.is_available() {
        return;
    }
    let init = Initializer::RandomNormal {
        mean: 0.0,
        stddev: 0.1,
        seed: 7,
    };
    let var = RedisVariable::open(
        Variable::<i64>::builder("emb")
            .dim(DIM)
            .initializer(init.clone()),
        config(&server, form),
    )
    .unwrap();
    assert_eq!(var.uses_module(), form == Form::Module);
    let local = Variable::<i64>::builder("emb")
        .dim(DIM)
        .initializer(init)
        .build()
        .unwrap();
    let store = FreezeBeforeWriteBack {
        var: &var,
        server: &server,
        armed: AtomicBool::new(false),
        thaw: Mutex::new(None),
    };
    let (adam_remote, adam_local) = (
        SparseAdam::new(ParamsAdam {
            lr: 0.05,
            ..Default::default()
        })
        .unwrap(),
        SparseAdam::new(ParamsAdam {
            lr: 0.05,
            ..Default::default()
        })
        .unwrap(),
    );
    let keys: Vec<i64> = (0..100).chain(0..20).collect();
    let grads: Vec<f32> = (0..keys.len() * DIM)
        .map(|i| ((i * 37) % 11) as f32 / 10.0 - 0.5)
        .collect();
    let mut normal_calls = 0;
    for step in 0..4 {
        let frozen = step == 2;
        store.armed.store(frozen, Ordering::SeqCst);
        let start = write_calls(&server);
        adam_remote.apply(&store, &keys, &grads).unwrap();
        if let Some(thaw) = store.thaw.lock().unwrap().take() {
            thaw.join().unwrap();
        }
        let calls = write_calls(&server) - start;
        match step {
            1 => normal_calls = calls,
            2 => assert_eq!(calls, 2 * normal_calls, "the write-back was resent once"),
            _ => {}
        }
        adam_local.apply(&local, &keys, &grads).unwrap();
        let distinct: Vec<i64> = (0..100).collect();
        assert_eq!(
            rows_and_slots(&var, &distinct),
            rows_and_slots(&local, &distinct),
            "step {step}: rows, m and v as on a local variable"
        );
    }
    assert!(normal_calls > 0, "the write-back runs scripts");
    assert_eq!(
        module_calls([&server]) > 0,
        form == Form::Module,
        "the writes ran in the {form:?} form"
    );
}
