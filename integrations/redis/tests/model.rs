//! The core's model-based contract (`core/tests/contract/mod.rs`, shared by
//! path, not copied) run on `RedisVariable`: random sequences of every
//! operation against a `HashMap` model, and slots, `update_rows`, scores
//! and `restrict` against the second model; on a single server and on a
//! 3-master cluster. Fewer cases than the core runs (each operation is a
//! round trip to a real server). The single server runs the models under
//! both forms of the writes (`dynemb-redis-module`'s commands, the Lua
//! scripts), and once more without the module loaded (where the variable
//! falls back to the scripts); the cluster under the module's.

#[path = "../../../core/tests/contract/mod.rs"]
mod contract;
mod support;

use contract::{Maker, RowUpdate, Spec, Subject, TestKey};
use dynemb::{Key, Result, SlotId};
use dynemb_redis::{RedisConfig, RedisVariable};
use support::{module_calls, unique_name, Cluster, Form, Server};

/// Makes Redis variables on one set of servers, each under a new name,
/// checking that they run their writes in the given form.
struct Remote(RedisConfig, Form);

/// A variable removed from Redis when the case drops it.
struct Dropped<K: Key>(Option<RedisVariable<K>>);

impl<K: Key> Drop for Dropped<K> {
    fn drop(&mut self) {
        if let Some(var) = self.0.take() {
            let _ = var.destroy();
        }
    }
}

impl Maker for Remote {
    fn make<K: TestKey>(&self, spec: Spec) -> Box<dyn Subject<K>> {
        let mut b = RedisVariable::<K>::builder(unique_name(spec.name))
            .dim(spec.dim)
            .initializer(spec.initializer)
            .config(RedisConfig {
                buckets: 8,
                ..self.0.clone()
            });
        if let Some(policy) = spec.policy {
            b = b.restrict_policy(policy);
        }
        let var = b.build().expect("open");
        assert_eq!(var.uses_module(), self.1 == Form::Module);
        Box::new(Dropped(Some(var)))
    }
}

impl<K: Key> Dropped<K> {
    fn var(&self) -> &RedisVariable<K> {
        self.0.as_ref().expect("alive")
    }
}

impl<K: Key> Subject<K> for Dropped<K> {
    fn lookup(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        self.var().lookup(keys, out)
    }
    fn lookup_with_exists(&self, keys: &[K], out: &mut [f32], exists: &mut [bool]) -> Result<()> {
        self.var().lookup_with_exists(keys, out, exists)
    }
    fn lookup_or_insert(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        self.var().lookup_or_insert(keys, out)
    }
    fn upsert(&self, keys: &[K], values: &[f32]) -> Result<()> {
        self.var().upsert(keys, values)
    }
    fn accum(&self, keys: &[K], deltas: &[f32], exists: &[bool]) -> Result<()> {
        self.var().accum(keys, deltas, exists)
    }
    fn remove(&self, keys: &[K]) -> Result<()> {
        self.var().remove(keys)
    }
    fn clear(&self) -> Result<()> {
        self.var().clear()
    }
    fn size(&self) -> Result<usize> {
        self.var().size()
    }
    fn shard_size(&self, _shard: usize) -> Option<usize> {
        None
    }
    fn export(&self) -> Result<(Vec<K>, Vec<f32>)> {
        self.var().export()
    }
    fn export_chunks(&self, rows_per_chunk: usize) -> Vec<Result<(Vec<K>, Vec<f32>)>> {
        self.var().export_chunks(rows_per_chunk).collect()
    }
    fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        self.var().create_slot(name, initial)
    }
    fn slot_id(&self, name: &str) -> Result<SlotId> {
        self.var().slot_id(name)
    }
    fn slot_names(&self) -> Result<Vec<String>> {
        self.var().slot_names()
    }
    fn slot_initial(&self, slot: SlotId) -> Result<f32> {
        self.var().slot_initial(slot)
    }
    fn lookup_slot(&self, slot: SlotId, keys: &[K], out: &mut [f32]) -> Result<()> {
        self.var().lookup_slot(slot, keys, out)
    }
    fn lookup_scores(&self, keys: &[K], out: &mut [u64]) -> Result<()> {
        self.var().lookup_scores(keys, out)
    }
    fn update_rows(&self, keys: &[K], slots: &[SlotId], update: &mut RowUpdate<'_>) -> Result<()> {
        self.var().update_rows(keys, slots, update)
    }
    fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        self.var().restrict(num_reserved, trigger)
    }
}

/// Proptest cases per model and server set.
const CASES: u32 = 32;

/// Runs the random cases of both models (`cases` each) and, if `long`,
/// the long fixed sequences on `remote`.
fn check_models(remote: &Remote, cases: u32, long: bool) {
    let mut runner = proptest::test_runner::TestRunner::new(contract::config(cases));
    runner
        .run(&contract::case_strategy(false), |case| {
            contract::run(remote, case);
            Ok(())
        })
        .unwrap();
    runner
        .run(&contract::slot_case_strategy(), |case| {
            contract::run_slots(remote, case);
            Ok(())
        })
        .unwrap();
    if long {
        contract::long_fixed_sequence(remote);
        contract::slots_and_scores_long_fixed_sequence(remote);
    }
}

#[test]
fn single_server_matches_the_models() {
    let server = Server::start();
    for form in Form::BOTH {
        let before = module_calls([&server]);
        check_models(&Remote(form.config(server.config()), form), CASES, true);
        let calls = module_calls([&server]) - before;
        match form {
            Form::Module => assert!(calls > 1000, "the writes ran as module commands ({calls})"),
            Form::Lua => assert_eq!(calls, 0, "the writes ran as scripts"),
        }
    }
}

#[test]
fn a_server_without_the_module_matches_the_models_with_scripts() {
    let server = Server::start_without_module();
    // `use_module` is on, but the server lacks the module: scripts.
    check_models(&Remote(server.config(), Form::Lua), CASES / 2, true);
}

#[test]
fn cluster_matches_the_models() {
    let cluster = Cluster::start(3);
    check_models(&Remote(cluster.config(), Form::Module), CASES / 2, false);
    for server in &cluster.servers {
        assert!(module_calls([server]) > 0, "every node ran module commands");
    }
}
