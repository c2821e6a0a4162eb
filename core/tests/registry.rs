//! Integration tests of `Registry` against TF's `get_variable` semantics:
//! reuse modes, scope nesting and inheritance, mismatches, collections,
//! local variables, custom getters and their composition, concurrent
//! creation, the global registry and bad names.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use dynemb::{
    AnyVariable, Collection, Error, Initializer, Key, Registry, Reuse, Variable, VariableBuilder,
};

// ---------------------------------------------------------------- helpers

fn b<K: Key>(name: &str, dim: usize) -> VariableBuilder<K> {
    Variable::<K>::builder(name).dim(dim)
}

fn read<K: Key>(v: &Variable<K>, key: K) -> Vec<f32> {
    let mut out = vec![f32::NAN; v.dim()];
    v.lookup(&[key], &mut out).expect("lookup");
    out
}

/// The two handles share tables: a write through one is read through the
/// other, and sizes agree.
fn assert_shared<K: Key>(a: &Variable<K>, b: &Variable<K>, key: K) {
    let row: Vec<f32> = (0..a.dim()).map(|i| i as f32 + 0.25).collect();
    a.upsert(&[key], &row).expect("upsert");
    assert_eq!(read(b, key), row);
    assert_eq!(a.size(), b.size());
}

// ---------------------------------------------------------------- get_variable

#[test]
fn top_level_is_auto_and_returns_the_same_tables() {
    let reg = Registry::new();
    let a = reg.get_variable(b::<i64>("emb", 4)).unwrap();
    let c = reg.get_variable(b::<i64>("emb", 4)).unwrap();
    assert_eq!(a.name(), "emb");
    assert_shared(&a, &c, -9);
    assert_eq!(reg.collection(Collection::Global), ["emb"]);
}

#[test]
fn a_later_request_does_not_change_the_existing_variable() {
    let reg = Registry::new();
    let a = reg
        .get_variable(
            b::<u64>("emb", 2)
                .shards(2)
                .initializer(Initializer::Constant(1.0)),
        )
        .unwrap();
    let c = reg
        .get_variable(b::<u64>("emb", 2).shards(4).trainable(false))
        .unwrap();
    assert_eq!(c.num_shards(), 2);
    assert!(c.trainable());
    assert_eq!(read(&c, 3), [1.0, 1.0]);
    assert_shared(&a, &c, 3);
}

#[test]
fn scope_reuse_no_requires_a_new_name() {
    let reg = Registry::new();
    let fresh = reg.scope("s").reuse(Reuse::No);
    fresh.get_variable(b::<i64>("a", 2)).unwrap();
    let err = fresh.get_variable(b::<i64>("a", 2)).unwrap_err();
    assert_eq!(err, Error::AlreadyExists { name: "s/a".into() });
    assert_eq!(err.to_string(), "variable s/a already exists");
    // Also when the other request would mismatch: existence is checked first.
    assert!(matches!(
        fresh.get_variable(b::<u32>("a", 9)),
        Err(Error::AlreadyExists { .. })
    ));
    assert_eq!(reg.collection(Collection::Global), ["s/a"]);
}

#[test]
fn scope_reuse_yes_requires_an_existing_name() {
    let reg = Registry::new();
    let reusing = reg.scope("s").reuse(Reuse::Yes);
    let err = reusing.get_variable(b::<i64>("a", 2)).unwrap_err();
    assert_eq!(err, Error::NotFound { name: "s/a".into() });
    assert_eq!(err.to_string(), "variable s/a does not exist");
    assert!(reg.collection(Collection::Global).is_empty());

    let created = reg.scope("s").get_variable(b::<i64>("a", 2)).unwrap();
    let reused = reusing.get_variable(b::<i64>("a", 2)).unwrap();
    assert_shared(&created, &reused, 1);
}

#[test]
fn scope_reuse_auto_gets_or_creates() {
    let reg = Registry::new();
    let auto = reg.scope("s").reuse(Reuse::Auto);
    assert_eq!(auto.reuse_mode(), Reuse::Auto);
    let a = auto.get_variable(b::<u32>("a", 3)).unwrap();
    let c = auto.get_variable(b::<u32>("a", 3)).unwrap();
    assert_shared(&a, &c, u32::MAX);
    assert_eq!(reg.collection(Collection::Global), ["s/a"]);
}

#[test]
fn the_default_reuse_mode_is_auto() {
    assert_eq!(Reuse::default(), Reuse::Auto);
    let reg = Registry::new();
    assert_eq!(reg.scope("x").reuse_mode(), Reuse::Auto);
}

// ---------------------------------------------------------------- scopes

#[test]
fn scopes_nest_names() {
    let reg = Registry::new();
    let user = reg.scope("tower").scope("user");
    assert_eq!(user.name(), "tower/user");
    let emb = user.get_variable(b::<i64>("emb", 2)).unwrap();
    assert_eq!(emb.name(), "tower/user/emb");
    assert!(reg.contains("tower/user/emb"));
    assert!(!reg.contains("emb"));
    // The same full name reached another way is the same variable.
    let direct = reg
        .scope("tower/user")
        .get_variable(b::<i64>("emb", 2))
        .unwrap();
    assert_shared(&emb, &direct, 5);
    let top = reg.get_variable(b::<i64>("tower/user/emb", 2)).unwrap();
    assert_shared(&emb, &top, 6);
    assert_eq!(reg.collection(Collection::Global), ["tower/user/emb"]);
}

#[test]
fn a_child_scope_inherits_the_reuse_mode_unless_set() {
    let reg = Registry::new();
    let yes = reg.scope("t").reuse(Reuse::Yes);
    // Inherited Yes: a missing name is not found, at any depth.
    assert!(matches!(
        yes.scope("u").get_variable(b::<i64>("e", 1)),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        yes.scope("u").scope("v").get_variable(b::<i64>("e", 1)),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(yes.scope("u").reuse_mode(), Reuse::Yes);
    // Set on the child: it applies.
    let created = yes
        .scope("u")
        .reuse(Reuse::No)
        .get_variable(b::<i64>("e", 1))
        .unwrap();
    assert_eq!(created.name(), "t/u/e");
    // And the inheriting child now finds it.
    let found = yes.scope("u").get_variable(b::<i64>("e", 1)).unwrap();
    assert_shared(&created, &found, 0);
    // Inherited No.
    let no = reg.scope("t").reuse(Reuse::No);
    assert!(matches!(
        no.scope("u").get_variable(b::<i64>("e", 1)),
        Err(Error::AlreadyExists { .. })
    ));
    // A child made before the parent's mode was set keeps what it inherited.
    let parent = reg.scope("p");
    let child = parent.scope("c");
    let _parent = parent.reuse(Reuse::Yes);
    assert_eq!(child.reuse_mode(), Reuse::Auto);
    assert!(child.get_variable(b::<i64>("e", 1)).is_ok());
}

// ---------------------------------------------------------------- mismatch

#[test]
fn another_key_type_is_a_mismatch() {
    let reg = Registry::new();
    reg.scope("tower").get_variable(b::<i64>("emb", 8)).unwrap();
    let err = reg
        .scope("tower")
        .get_variable(b::<u64>("emb", 8))
        .unwrap_err();
    assert_eq!(
        err,
        Error::Mismatch {
            name: "tower/emb".into(),
            existing: "key type i64, dim 8".into(),
            requested: "key type u64, dim 8".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "variable tower/emb exists with key type i64, dim 8; requested key type u64, dim 8"
    );
}

#[test]
fn another_dim_is_a_mismatch() {
    let reg = Registry::new();
    reg.scope("tower").get_variable(b::<i64>("emb", 8)).unwrap();
    let err = reg
        .scope("tower")
        .reuse(Reuse::Yes)
        .get_variable(b::<i64>("emb", 16))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "variable tower/emb exists with key type i64, dim 8; requested key type i64, dim 16"
    );
    // Both at once.
    let err = reg.get_variable(b::<u32>("tower/emb", 16)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "variable tower/emb exists with key type i64, dim 8; requested key type u32, dim 16"
    );
    // Nothing was added.
    assert_eq!(reg.collection(Collection::Global), ["tower/emb"]);
}

#[test]
fn another_value_dtype_is_a_mismatch() {
    let reg = Registry::new();
    let bf16 = reg
        .get_variable(b::<i64>("emb", 8).value_dtype(dynemb::Dtype::Bf16))
        .unwrap();
    let err = reg.get_variable(b::<i64>("emb", 8)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "variable emb exists with key type i64, dim 8, value dtype bf16; requested key type i64, dim 8, value dtype f32"
    );
    let again = reg
        .get_variable(b::<i64>("emb", 8).value_dtype(dynemb::Dtype::Bf16))
        .unwrap();
    assert_eq!(again.value_dtype(), bf16.value_dtype());
    // Slot dtypes, like the other settings, are the existing variable's.
    let same = reg
        .get_variable(
            b::<i64>("emb", 8)
                .value_dtype(dynemb::Dtype::Bf16)
                .slot_dtype(dynemb::Dtype::F16),
        )
        .unwrap();
    assert_eq!(same.slot_dtype(), dynemb::Dtype::F32);
}

#[test]
fn different_key_types_live_side_by_side() {
    let reg = Registry::new();
    let a = reg.get_variable(b::<i64>("a", 1)).unwrap();
    let c = reg.get_variable(b::<u64>("b", 2)).unwrap();
    let d = reg.get_variable(b::<i32>("c", 3)).unwrap();
    let e = reg.get_variable(b::<u32>("d", 4)).unwrap();
    a.upsert(&[-1], &[1.0]).unwrap();
    c.upsert(&[u64::MAX], &[1.0, 2.0]).unwrap();
    d.upsert(&[i32::MIN], &[1.0; 3]).unwrap();
    e.upsert(&[7], &[1.0; 4]).unwrap();
    let all = reg.variables();
    let described: Vec<_> = all
        .iter()
        .map(|v| (v.name().to_owned(), v.key_type(), v.dim(), v.size()))
        .collect();
    assert_eq!(
        described,
        [
            ("a".to_owned(), "i64", 1, 1),
            ("b".to_owned(), "u64", 2, 1),
            ("c".to_owned(), "i32", 3, 1),
            ("d".to_owned(), "u32", 4, 1),
        ]
    );
    assert_eq!(read(&all[2].downcast::<i32>().unwrap(), i32::MIN), [1.0; 3]);
    assert!(all[2].downcast::<u32>().is_none());
}

// ---------------------------------------------------------------- collections

#[test]
fn collections_list_names_in_creation_order() {
    let reg = Registry::new();
    reg.get_variable(b::<i64>("z", 1)).unwrap();
    reg.get_local_variable(b::<i64>("step", 1)).unwrap();
    reg.get_variable(b::<i64>("frozen", 1).trainable(false))
        .unwrap();
    reg.scope("s").get_variable(b::<u64>("a", 1)).unwrap();
    reg.scope("s").get_local_variable(b::<u64>("m", 1)).unwrap();
    // Getting existing variables does not add or reorder.
    reg.get_variable(b::<i64>("z", 1)).unwrap();
    reg.get_local_variable(b::<i64>("step", 1)).unwrap();

    assert_eq!(
        reg.collection(Collection::Global),
        ["z", "step", "frozen", "s/a", "s/m"]
    );
    assert_eq!(reg.collection(Collection::Trainable), ["z", "s/a"]);
    assert_eq!(reg.collection(Collection::Local), ["step", "s/m"]);
    let names: Vec<String> = reg.variables().iter().map(|v| v.name().into()).collect();
    assert_eq!(names, reg.collection(Collection::Global));
}

#[test]
fn variables_report_their_checkpoint_flag() {
    let reg = Registry::new();
    reg.get_variable(b::<i64>("saved", 1)).unwrap();
    reg.get_variable(b::<i64>("scratch", 1).checkpoint(false))
        .unwrap();
    let flags: Vec<(String, bool)> = reg
        .variables()
        .iter()
        .map(|v| (v.name().into(), v.checkpoint()))
        .collect();
    assert_eq!(
        flags,
        [("saved".to_owned(), true), ("scratch".to_owned(), false)]
    );
}

#[test]
fn get_local_variable_is_untrainable_and_local() {
    let reg = Registry::new();
    let step = reg
        .scope("opt")
        .get_local_variable(b::<i64>("step", 1).trainable(true))
        .unwrap();
    assert_eq!(step.name(), "opt/step");
    assert!(!step.trainable());
    assert!(reg
        .collection(Collection::Local)
        .contains(&"opt/step".into()));
    assert!(reg
        .collection(Collection::Global)
        .contains(&"opt/step".into()));
    assert!(reg.collection(Collection::Trainable).is_empty());
    // Reuse modes apply to local variables too.
    assert!(matches!(
        reg.scope("opt")
            .reuse(Reuse::No)
            .get_local_variable(b::<i64>("step", 1)),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        reg.scope("opt")
            .reuse(Reuse::Yes)
            .get_local_variable(b::<i64>("missing", 1)),
        Err(Error::NotFound { .. })
    ));
    let again = reg.get_local_variable(b::<i64>("opt/step", 1)).unwrap();
    assert_shared(&step, &again, 1);
}

#[test]
fn get_local_variable_of_a_global_name_returns_it_unchanged() {
    let reg = Registry::new();
    let w = reg.get_variable(b::<i64>("w", 2)).unwrap();
    let same = reg.get_local_variable(b::<i64>("w", 2)).unwrap();
    assert!(same.trainable());
    assert_shared(&w, &same, 4);
    assert!(reg.collection(Collection::Local).is_empty());
    assert_eq!(reg.collection(Collection::Trainable), ["w"]);
}

// ---------------------------------------------------------------- custom getters

#[test]
fn a_custom_getter_can_rename() {
    let reg = Registry::new();
    let scope = reg.scope("s").custom_getter(|next, request| {
        assert_eq!(request.name(), "s/emb", "getters see the full name");
        assert_eq!(request.key_type(), "i64");
        let name = format!("{}/renamed", request.name());
        next.get(request.with_name(name))
    });
    let emb = scope.get_variable(b::<i64>("emb", 2)).unwrap();
    assert_eq!(emb.name(), "s/emb/renamed");
    assert_eq!(reg.collection(Collection::Global), ["s/emb/renamed"]);
    // The renamed variable is what later requests get.
    let again = scope.get_variable(b::<i64>("emb", 2)).unwrap();
    assert_shared(&emb, &again, 2);
    assert_eq!(reg.collection(Collection::Global).len(), 1);
}

#[test]
fn a_custom_getter_can_change_dim_initializer_and_flags() {
    let reg = Registry::new();
    let scope = reg.scope("s").custom_getter(|next, request| {
        let dim = request.dim() * 2;
        next.get(
            request
                .with_dim(dim)
                .with_shards(2)
                .with_initializer(Initializer::Constant(3.0))
                .with_trainable(false)
                .with_checkpoint(false),
        )
    });
    let emb = scope.get_variable(b::<u64>("emb", 4)).unwrap();
    assert_eq!(emb.dim(), 8);
    assert_eq!(emb.num_shards(), 2);
    assert_eq!(read(&emb, 11), [3.0; 8]);
    assert!(!emb.trainable());
    assert!(!emb.checkpoint());
    assert!(reg.collection(Collection::Trainable).is_empty());
}

/// A mixed-precision getter: it reads the dtypes asked for and stores
/// values and slots in bf16 when f32 was asked.
#[test]
fn a_custom_getter_can_change_the_dtypes() {
    let reg = Registry::new();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&asked);
    let scope = reg.scope("half").custom_getter(move |next, request| {
        seen.lock()
            .unwrap()
            .push((request.value_dtype(), request.slot_dtype()));
        let request = if request.value_dtype() == dynemb::Dtype::F32 {
            request
                .with_value_dtype(dynemb::Dtype::Bf16)
                .with_slot_dtype(dynemb::Dtype::Bf16)
        } else {
            request
        };
        next.get(request)
    });
    let emb = scope.get_variable(b::<u64>("emb", 4)).unwrap();
    assert_eq!(emb.value_dtype(), dynemb::Dtype::Bf16);
    assert_eq!(emb.slot_dtype(), dynemb::Dtype::Bf16);
    let f16 = scope
        .get_variable(b::<u64>("f16", 4).value_dtype(dynemb::Dtype::F16))
        .unwrap();
    assert_eq!(f16.value_dtype(), dynemb::Dtype::F16);
    assert_eq!(f16.slot_dtype(), dynemb::Dtype::F32);
    assert_eq!(
        *asked.lock().unwrap(),
        [
            (dynemb::Dtype::F32, dynemb::Dtype::F32),
            (dynemb::Dtype::F16, dynemb::Dtype::F32)
        ]
    );
}

#[test]
fn a_custom_getter_sees_the_request_flags() {
    let reg = Registry::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let scope = reg
        .scope("s")
        .reuse(Reuse::No)
        .custom_getter(move |next, request| {
            log.lock().unwrap().push((
                request.dim(),
                request.trainable(),
                request.checkpoint(),
                request.reuse(),
                request.is_local(),
            ));
            next.get(request)
        });
    scope.get_variable(b::<i32>("a", 3)).unwrap();
    scope
        .get_local_variable(b::<i32>("b", 5).checkpoint(false))
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (3, true, true, Reuse::No, false),
            (5, false, false, Reuse::No, true)
        ]
    );
}

#[test]
fn a_custom_getter_can_change_the_reuse_mode() {
    let reg = Registry::new();
    let scope = reg
        .scope("s")
        .reuse(Reuse::Yes)
        .custom_getter(|next, request| next.get(request.with_reuse(Reuse::Auto)));
    assert!(scope.get_variable(b::<i64>("a", 1)).is_ok());
}

#[test]
fn nested_custom_getters_compose_innermost_first() {
    let reg = Registry::new();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let (l1, l2) = (Arc::clone(&log), Arc::clone(&log));
    let outer = reg.scope("outer").custom_getter(move |next, request| {
        l1.lock()
            .unwrap()
            .push(format!("outer sees {}", request.name()));
        let name = format!("{}_o", request.name());
        let v = next.get(request.with_name(name))?;
        l1.lock().unwrap().push("outer returns".into());
        Ok(v)
    });
    let inner = outer.scope("inner").custom_getter(move |next, request| {
        l2.lock()
            .unwrap()
            .push(format!("inner sees {}", request.name()));
        let name = format!("{}_i", request.name());
        let dim = request.dim() + 1;
        let v = next.get(request.with_name(name).with_dim(dim))?;
        l2.lock().unwrap().push("inner returns".into());
        Ok(v)
    });
    let emb = inner.get_variable(b::<i64>("emb", 2)).unwrap();
    // TF: the inner scope's getter runs first; its `next` is the outer's.
    assert_eq!(emb.name(), "outer/inner/emb_i_o");
    assert_eq!(emb.dim(), 3);
    assert_eq!(
        *log.lock().unwrap(),
        [
            "inner sees outer/inner/emb",
            "outer sees outer/inner/emb_i",
            "outer returns",
            "inner returns"
        ]
    );
    // The outer scope itself only runs its own getter.
    log.lock().unwrap().clear();
    let o = outer.get_variable(b::<i64>("w", 1)).unwrap();
    assert_eq!(o.name(), "outer/w_o");
    assert_eq!(
        *log.lock().unwrap(),
        ["outer sees outer/w", "outer returns"]
    );
}

#[test]
fn custom_getters_on_one_scope_compose_last_added_first() {
    let reg = Registry::new();
    let scope = reg
        .scope("s")
        .custom_getter(|next, r| {
            let name = format!("{}_first", r.name());
            next.get(r.with_name(name))
        })
        .custom_getter(|next, r| {
            let name = format!("{}_second", r.name());
            next.get(r.with_name(name))
        });
    let emb = scope.get_variable(b::<i64>("e", 1)).unwrap();
    assert_eq!(emb.name(), "s/e_second_first");
}

#[test]
fn a_custom_getter_can_call_the_real_getter_twice() {
    // TF's testGetterThatCreatesTwoVariablesAndSumsThem, minus the sum.
    let reg = Registry::new();
    let scope = reg.scope("scope").custom_getter(|next, request| {
        let first = next.get(request.clone().with_name(format!("{}/0", request.name())))?;
        next.get(request.clone().with_name(format!("{}/1", request.name())))?;
        Ok(first)
    });
    let v = scope.get_variable(b::<i64>("v", 2)).unwrap();
    assert_eq!(v.name(), "scope/v/0");
    assert_eq!(
        reg.collection(Collection::Trainable),
        ["scope/v/0", "scope/v/1"]
    );
}

#[test]
fn custom_getter_errors_propagate_and_create_nothing() {
    let reg = Registry::new();
    let scope = reg.scope("s").custom_getter(|_, request| {
        Err(Error::InvalidArgument(format!(
            "{} is forbidden",
            request.name()
        )))
    });
    assert_eq!(
        scope.get_variable(b::<i64>("a", 1)).unwrap_err(),
        Error::InvalidArgument("s/a is forbidden".into())
    );
    assert!(reg.collection(Collection::Global).is_empty());
}

#[test]
fn a_custom_getter_returning_another_key_type_is_a_mismatch() {
    let reg = Registry::new();
    let other = Variable::<u32>::builder("elsewhere")
        .dim(2)
        .build()
        .unwrap();
    let scope = reg
        .scope("s")
        .custom_getter(move |_, _| Ok(AnyVariable::from(other.clone())));
    let err = scope.get_variable(b::<i64>("a", 2)).unwrap_err();
    assert_eq!(
        err,
        Error::Mismatch {
            name: "elsewhere".into(),
            existing: "key type u32, dim 2".into(),
            requested: "key type i64, dim 2".into(),
        }
    );
    // The same key type is handed through as is.
    let mine = Variable::<i64>::builder("mine").dim(2).build().unwrap();
    let handed = mine.clone();
    let scope = reg
        .scope("t")
        .custom_getter(move |_, _| Ok(AnyVariable::from(handed.clone())));
    let got = scope.get_variable(b::<i64>("a", 2)).unwrap();
    assert_shared(&mine, &got, 8);
    assert!(reg.collection(Collection::Global).is_empty());
}

#[test]
fn a_renamed_request_is_still_validated() {
    let reg = Registry::new();
    let scope = reg
        .scope("s")
        .custom_getter(|next, request| next.get(request.with_name("bad//name")));
    assert!(matches!(
        scope.get_variable(b::<i64>("a", 1)),
        Err(Error::InvalidArgument(_))
    ));
    // And a getter can repair a name the caller got wrong.
    let scope = reg
        .scope("t")
        .custom_getter(|next, request| next.get(request.with_name("t/fixed")));
    assert_eq!(
        scope.get_variable(b::<i64>("", 1)).unwrap().name(),
        "t/fixed"
    );
}

// ---------------------------------------------------------------- concurrency

#[test]
fn concurrent_get_variable_of_one_name_creates_one_variable() {
    const THREADS: usize = 8;
    for round in 0..20 {
        let reg = Registry::new();
        let barrier = Barrier::new(THREADS);
        let handles: Vec<Variable<i64>> = thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        reg.scope("tower")
                            .get_variable(b::<i64>("shared", 4).init_size(1 << 10))
                            .unwrap()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert_eq!(
            reg.collection(Collection::Global),
            ["tower/shared"],
            "round {round}"
        );
        handles[0].upsert(&[42], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(read(h, 42), [1.0, 2.0, 3.0, 4.0], "handle {i}");
            assert_eq!(h.size(), 1, "handle {i}");
        }
    }
}

#[test]
fn concurrent_reuse_no_lets_exactly_one_thread_create() {
    const THREADS: usize = 8;
    let reg = Registry::new();
    let barrier = Barrier::new(THREADS);
    let results: Vec<_> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    reg.scope("s")
                        .reuse(Reuse::No)
                        .get_variable(b::<u64>("once", 2))
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    for r in &results {
        if let Err(e) = r {
            assert_eq!(
                e,
                &Error::AlreadyExists {
                    name: "s/once".into()
                }
            );
        }
    }
    assert_eq!(reg.collection(Collection::Global), ["s/once"]);
}

#[test]
fn concurrent_get_variable_of_many_names() {
    const THREADS: usize = 8;
    let reg = Registry::new();
    let barrier = Barrier::new(THREADS);
    thread::scope(|s| {
        for t in 0..THREADS {
            let (reg, barrier) = (&reg, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..50 {
                    // Every thread asks for every name; each name is created once.
                    let v = reg.get_variable(b::<i64>(&format!("v{i}"), 1)).unwrap();
                    v.accum(&[t as i64], &[1.0], &[false]).unwrap();
                }
            });
        }
    });
    let mut names = reg.collection(Collection::Global);
    assert_eq!(names.len(), 50);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 50);
    for i in 0..50 {
        let v = reg.get_variable(b::<i64>(&format!("v{i}"), 1)).unwrap();
        assert_eq!(v.size(), THREADS, "v{i}");
    }
}

#[test]
fn a_failed_build_leaves_the_name_free() {
    let reg = Registry::new();
    let err = reg.get_variable(b::<i64>("emb", 0)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(!reg.contains("emb"));
    assert!(matches!(
        reg.scope("x")
            .reuse(Reuse::Yes)
            .get_variable(b::<i64>("emb", 1)),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        reg.get_variable(b::<i64>("emb", 1)).map(|v| v.dim()),
        Ok(1)
    ));
}

#[test]
fn concurrent_failed_builds_do_not_wedge_the_name() {
    const THREADS: usize = 8;
    let reg = Registry::new();
    let barrier = Barrier::new(THREADS);
    thread::scope(|s| {
        for t in 0..THREADS {
            let (reg, barrier) = (&reg, &barrier);
            s.spawn(move || {
                barrier.wait();
                for _ in 0..100 {
                    // Odd threads ask with an invalid dim, even threads with a valid one.
                    let dim = if t % 2 == 1 { 0 } else { 2 };
                    match reg.get_variable(b::<i64>("flaky", dim)) {
                        Ok(v) => assert_eq!(v.dim(), 2),
                        // Building with dim 0 fails, or the name exists with dim 2.
                        Err(Error::InvalidArgument(_)) | Err(Error::Mismatch { .. }) => {
                            assert_eq!(dim, 0)
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            });
        }
    });
    assert_eq!(reg.collection(Collection::Global), ["flaky"]);
}

// ---------------------------------------------------------------- global, names

#[test]
fn global_is_one_registry() {
    let a = Registry::global();
    let c = thread::spawn(Registry::global).join().unwrap();
    assert!(std::ptr::eq(a, c));
    let v = a
        .scope("registry_test_global")
        .get_variable(b::<i64>("emb", 2))
        .unwrap();
    let w = c
        .get_variable(b::<i64>("registry_test_global/emb", 2))
        .unwrap();
    assert_shared(&v, &w, 3);
    assert!(Registry::global().contains("registry_test_global/emb"));
}

#[test]
fn bad_names_are_invalid_arguments() {
    let reg = Registry::new();
    for bad in ["", "/", "a//b", "/a", "a/", "a/b/"] {
        let err = reg.get_variable(b::<i64>(bad, 1)).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(msg) if msg.contains("empty component")),
            "{bad:?}: {err}"
        );
        assert!(matches!(
            reg.get_local_variable(b::<i64>(bad, 1)),
            Err(Error::InvalidArgument(_))
        ));
    }
    // Empty components coming from scopes.
    assert!(matches!(
        reg.scope("s").get_variable(b::<i64>("", 1)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        reg.scope("").get_variable(b::<i64>("a", 1)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        reg.scope("s").scope("").get_variable(b::<i64>("a", 1)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        reg.scope("s/").get_variable(b::<i64>("a", 1)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(reg.collection(Collection::Global).is_empty());
}

#[test]
fn debug_output_names_the_variables() {
    let reg = Registry::new();
    reg.scope("s").get_variable(b::<i64>("a", 1)).unwrap();
    assert!(format!("{reg:?}").contains("s/a"));
    let scope = reg
        .scope("s")
        .reuse(Reuse::Yes)
        .custom_getter(|n, r| n.get(r));
    let text = format!("{scope:?}");
    assert!(text.contains("\"s\"") && text.contains("Yes"), "{text}");
    assert!(format!("{:?}", reg.variables()[0]).contains("i64"));
}
