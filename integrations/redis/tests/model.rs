//! The model-based contract every table storage keeps
//! (`dynemb_test_support::contract`, shared with `dynemb`'s tests of
//! `Variable`) run on `RedisVariable`: random sequences of every
//! operation against a `HashMap` model, and slots, `update_rows`, scores
//! and `restrict` against the second model; on a single server and on a
//! 3-master cluster. Fewer cases than the core runs (each operation is a
//! round trip to a real server). The single server runs the models under
//! both forms of the writes (`dynemb-redis-module`'s commands, the Lua
//! scripts), and once more without the module loaded (where the variable
//! falls back to the scripts); the cluster under the module's, or the
//! scripts' where the module cannot be built.

use dynemb::Variable;
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::contract::{self, Maker, Spec, TestKey};
use dynemb_test_support::servers::{module_calls, unique_name, Cluster, Form, Server};

/// Makes Redis variables on one set of servers, each under a new name,
/// checking that they run their writes in the given form, and removes
/// them from Redis when their case ends. Shards and custom partitioners
/// are a local table's: a Redis table has one shard, its keys spread over
/// buckets, so they are left out of what it opens.
struct Remote(RedisConfig, Form);

impl Maker for Remote {
    type Table<K: TestKey> = RedisVariable<K>;

    fn make<K: TestKey>(&self, spec: Spec) -> RedisVariable<K> {
        let mut b = Variable::<K>::builder(unique_name(spec.name))
            .dim(spec.dim)
            .initializer(spec.initializer);
        if let Some(policy) = spec.policy {
            b = b.restrict_policy(policy);
        }
        let config = RedisConfig {
            buckets: 8,
            ..self.0.clone()
        };
        let var = RedisVariable::open(b, config).expect("open");
        assert_eq!(var.uses_module(), self.1 == Form::Module);
        var
    }

    fn discard<K: TestKey>(&self, table: RedisVariable<K>) {
        table.destroy().expect("destroy");
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
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
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
    let Some(server) = Server::start_without_module() else {
        return;
    };
    // `use_module` is on, but the server lacks the module: scripts.
    check_models(&Remote(server.config(), Form::Lua), CASES / 2, true);
}

#[test]
fn cluster_matches_the_models() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    let form = if Form::Module.is_available() {
        Form::Module
    } else {
        Form::Lua
    };
    check_models(&Remote(cluster.config(), form), CASES / 2, false);
    for server in &cluster.servers {
        assert_eq!(
            module_calls([server]) > 0,
            form == Form::Module,
            "every node ran module commands"
        );
    }
}
