//! The Redis table of `--redis` ([`open_redis`]): named `ctr/embeddings`
//! under `--redis-prefix`, with the local table's initializer and restrict
//! policy, so a checkpoint moves between the two. A Redis table has no
//! capacity or admission and stores f32 only, so the configuration refuses
//! `--capacity`, `--min-count` and half-precision `--dtype` or
//! `--slot-dtype` with `--redis`; it expires rows on its servers
//! (`--expire`). The trainer is generic
//! over `dynemb::EmbeddingTable` and trains this table or a local
//! `Variable<i64>` with the same code.
//!
//! A new run refuses a table that holds rows unless `--overwrite` clears
//! them, since they may be a live run's; a resumed run leaves it to the
//! trainer, which replaces its contents with the checkpoint's table so that
//! rows, MLP and step count are those of one moment of the run. A table of
//! the same name with other settings (another `--dim` or `--seed`) is
//! refused when it opens, with a hint to choose another prefix.

use dynemb_redis::{RedisConfig, RedisVariable};

use crate::config::RedisChoice;
use crate::model::{table_description, TableLifecycle, TablePrecision};

/// Opens the Redis table `choice` describes for `dim`-wide rows from
/// `seed` (the local table's settings), and clears it if `clear`; returns
/// it with the number of rows an earlier run had left in it.
pub fn open_redis(
    choice: &RedisChoice,
    dim: usize,
    seed: u64,
    clear: bool,
) -> crate::train::Result<(RedisVariable<i64>, usize)> {
    let config = RedisConfig {
        nodes: choice.nodes.clone(),
        prefix: choice.prefix.clone(),
        ..RedisConfig::default()
    };
    let description = table_description(dim, seed, TableLifecycle::NONE, TablePrecision::F32);
    let table = RedisVariable::open(description, config).map_err(
        |error| -> Box<dyn std::error::Error> {
            match error {
                dynemb::Error::Mismatch { .. } => format!(
                    "{error} (a table left by a run with other settings: choose another \
                     --redis-prefix than {:?})",
                    choice.prefix
                )
                .into(),
                other => other.into(),
            }
        },
    )?;
    let left = table.size()?;
    if clear && left > 0 {
        table.clear()?;
    }
    Ok((table, left))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedisChoice;
    use crate::data::{Synthetic, SyntheticConfig};
    use crate::redis_support::Server;
    use crate::source::DataSource;
    use crate::train::{check_reload, sample_keys, ModelConfig, Trainer, RELOAD_KEYS};
    use dynemb::EmbeddingTable;
    use std::time::Duration;

    fn model() -> ModelConfig {
        ModelConfig {
            fields: 8,
            dim: 8,
            shards: 2,
            seed: 11,
            max_size: None,
            lifecycle: TableLifecycle::NONE,
            precision: TablePrecision::F32,
        }
    }

    /// The data: [`STEPS`] batches of [`BATCH`] samples, then 500 held out.
    fn data() -> Synthetic {
        Synthetic::new(&SyntheticConfig {
            fields: 8,
            train_samples: STEPS * BATCH,
            eval_samples: 500,
            seed: 5,
        })
        .unwrap()
    }

    /// Training steps of the parity run.
    const STEPS: usize = 200;
    /// Samples per step.
    const BATCH: usize = 32;

    /// `trainer` after [`STEPS`] batches.
    fn train<T: EmbeddingTable<Key = i64> + 'static>(mut trainer: Trainer<T>) -> Trainer<T> {
        let mut source = data();
        while let Some(batch) = source.next_batch(BATCH).unwrap() {
            trainer.step(&batch).unwrap();
        }
        assert_eq!(trainer.steps(), STEPS as u64);
        trainer
    }

    /// The same `values` of `a` and `b`, to 1e-6.
    fn close(what: &str, a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-6, "{what}[{i}]: {x} against {y}");
        }
    }

    /// 200 training steps of the ctr model on a real `redis-server`
    /// (started here, stopped by PID) give the local run's rows, Adam slots
    /// and predictions, to 1e-6; the
    /// Redis-trained model reloads into a local table identically; a
    /// second opening of the table clears what the first left; the
    /// servers expire rows by age.
    #[test]
    fn a_redis_table_trains_like_a_local_one() {
        let Some(server) = Server::start() else {
            return;
        };
        let choice = RedisChoice {
            nodes: vec![server.addr()],
            prefix: "ctr_test".into(),
            keep: false,
        };
        let config = model();
        let (table, left) = open_redis(&choice, config.dim, config.seed, true).unwrap();
        assert_eq!(left, 0);
        let handle = table.clone();
        let remote = train(Trainer::with_table(config.clone(), table).unwrap());
        let local = train(Trainer::new(config.clone()).unwrap());

        let rows = local.table().size();
        assert!(rows > 1000, "{rows} rows");
        assert_eq!(remote.table().size().unwrap(), rows);
        let memory = remote.table().memory_bytes().unwrap();
        assert!(memory > rows * config.dim * 4, "{memory} bytes in Redis");
        let keys = sample_keys(local.table(), rows).unwrap();
        assert_eq!(keys.len(), rows);
        let n = keys.len() * config.dim;
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        let mut exists = vec![false; keys.len()];
        local.table().lookup(&keys, &mut a).unwrap();
        remote
            .table()
            .lookup_with_exists(&keys, &mut b, &mut exists)
            .unwrap();
        assert!(exists.iter().all(|&e| e), "a trained key is not in Redis");
        close("rows", &a, &b);
        for slot in ["m", "v"] {
            let (x, y) = (local.table(), remote.table());
            x.lookup_slot(x.slot_id(slot).unwrap(), &keys, &mut a)
                .unwrap();
            y.lookup_slot(y.slot_id(slot).unwrap(), &keys, &mut b)
                .unwrap();
            close(slot, &a, &b);
        }
        let eval = data().eval_set().samples.clone();
        close(
            "predictions",
            &local.predict(&eval).unwrap(),
            &remote.predict(&eval).unwrap(),
        );

        let dir = tempfile::tempdir().unwrap();
        remote.save(dir.path()).unwrap();
        let reloaded = Trainer::load(config.clone(), dir.path()).unwrap();
        let check = check_reload(&remote, &reloaded, &eval).unwrap();
        assert_eq!((check.rows, check.keys), (rows, RELOAD_KEYS.min(rows)));

        // Reopened (a run with `--redis-keep` before): cleared first.
        drop(remote);
        let (again, left) = open_redis(&choice, config.dim, config.seed, true).unwrap();
        assert_eq!((left, again.size().unwrap()), (rows, 0));
        // Other settings under the same prefix: refused, naming the flag.
        let message = open_redis(&choice, config.dim + 1, config.seed, true)
            .unwrap_err()
            .to_string();
        assert!(message.contains("--redis-prefix"), "{message}");

        // Expiry on the servers (`--expire`): nothing is an hour old;
        // every row is older than a few milliseconds a while after its step.
        let (table, _) = open_redis(&choice, config.dim, config.seed, true).unwrap();
        let mut trainer = Trainer::with_table(config.clone(), table).unwrap();
        trainer
            .step(&data().next_batch(BATCH).unwrap().unwrap())
            .unwrap();
        let rows = trainer.table().size().unwrap();
        assert!(rows > 0);
        assert_eq!(trainer.expire(Duration::from_secs(3600)).unwrap(), 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(trainer.expire(Duration::from_millis(5)).unwrap(), rows);
        assert_eq!(trainer.counts().unwrap().expired, rows as u64);
        assert_eq!(trainer.table().size().unwrap(), 0);
        handle.destroy().unwrap();
    }
}
