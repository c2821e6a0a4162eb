//! The CTR model: one dynemb table holding every field's embeddings (ids
//! are salted by field, see `source`), concatenated per sample and fed to
//! an MLP 256-128-1 of candle-nn `Linear` layers with ReLU; the output is
//! the click logit.
//!
//! The table is a `dynemb::Variable<i64>` (or, with `--redis`, a
//! `dynemb_redis::RedisVariable<i64>` of the same settings, see `table`;
//! the model is generic over it) with a timestamp restrict policy
//! (so the training loop can keep it under `--max-size` by evicting the
//! least recently trained rows, a `--capacity` evicts those first, and
//! `--expire` finds the rows not trained for a while) and small
//! random-normal rows, deterministic per id. With `--min-count`, an id
//! gets a row only at its Nth training read ([`TableLifecycle`]). The MLP's weights live in a candle-nn `VarMap`, so they save and
//! load as safetensors.
//!
//! The table stores its values and its Adam slots in the dtypes of
//! [`TablePrecision`] (`--dtype`, `--slot-dtype`; f32 unless asked): the
//! model reads and trains in f32 either way, rows are rounded to the dtype
//! (to nearest even) as they are written, and with `--stochastic-rounding`
//! the optimizer's writes to bf16 columns round stochastically. The MLP
//! stays f32.
//!
//! The MLP's initial weights come from the seed: [`init_mlp`] overwrites
//! what `candle_nn::linear` drew, after the layers are built, with values
//! drawn the same way from a PCG stream of the seed, because candle's CPU
//! generator cannot be seeded (`Device::Cpu.set_seed` is an error). A
//! checkpoint's values are loaded over them.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use candle_core::{Device, Module, Tensor, Var};
use candle_nn::{Linear, VarBuilder, VarMap};
use dynemb::{
    Admission, Dtype, EmbeddingStore, Initializer, RestrictPolicy, Rounding, Variable,
    VariableBuilder,
};
use dynemb_candle::{Embedding, EmbeddingConfig};
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use rand_pcg::Pcg64Mcg;

/// Widths of the MLP's hidden layers.
pub const HIDDEN: [usize; 2] = [256, 128];

/// The embedding table's name, local or in Redis (so that a checkpoint
/// moves between the two).
pub const TABLE_NAME: &str = "ctr/embeddings";

/// The initializer of the table's rows: random normal, deterministic per
/// id and `seed`.
pub fn row_initializer(seed: u64) -> Initializer {
    Initializer::RandomNormal {
        mean: 0.0,
        stddev: 0.05,
        seed,
    }
}

/// The restrict policy of the table: a row's score is when it was last
/// trained, so `--max-size` and `--capacity` evict the least recently
/// trained rows and `--expire` removes the ones not trained for a while.
pub const TABLE_POLICY: RestrictPolicy = RestrictPolicy::Timestamp;

/// How rows come and go besides training (`--capacity`, `--min-count`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableLifecycle {
    /// Most rows the table ever holds; `None`: no bound.
    pub capacity: Option<usize>,
    /// The training read at which an id gets a row; 1: its first.
    pub min_count: u32,
}

impl TableLifecycle {
    /// No capacity, every id admitted at its first read.
    pub const NONE: TableLifecycle = TableLifecycle {
        capacity: None,
        min_count: 1,
    };
}

impl Default for TableLifecycle {
    /// [`TableLifecycle::NONE`].
    fn default() -> Self {
        TableLifecycle::NONE
    }
}

/// How the table stores its rows (`--dtype`, `--slot-dtype`,
/// `--stochastic-rounding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TablePrecision {
    /// The dtype of the embedding values.
    pub values: Dtype,
    /// The dtype of the Adam slots `m` and `v`.
    pub slots: Dtype,
    /// How the optimizer's steps round to bf16 columns.
    pub rounding: Rounding,
}

impl TablePrecision {
    /// Everything in f32 (the only precision a Redis table stores).
    pub const F32: TablePrecision = TablePrecision {
        values: Dtype::F32,
        slots: Dtype::F32,
        rounding: Rounding::NearestEven,
    };

    /// Whether the values or the slots are stored as bf16 (the columns
    /// stochastic rounding rounds).
    pub fn has_bf16_column(&self) -> bool {
        self.values == Dtype::Bf16 || self.slots == Dtype::Bf16
    }
}

impl Default for TablePrecision {
    /// [`TablePrecision::F32`].
    fn default() -> Self {
        TablePrecision::F32
    }
}

impl std::fmt::Display for TablePrecision {
    /// `values bf16, slots f32`, and `, stochastic rounding (seed N)` if
    /// asked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "values {}, slots {}", self.values, self.slots)?;
        if let Rounding::Stochastic { seed } = self.rounding {
            write!(f, ", stochastic rounding (seed {seed})")?;
        }
        Ok(())
    }
}

/// The embedding table's description for `dim`-wide rows, named
/// [`TABLE_NAME`], with `lifecycle`'s capacity and admission (exact
/// counts; none for a `min_count` of 1) and `precision`'s dtypes: built
/// here as a local table ([`embedding_table`]) or opened in Redis
/// (`table::open_redis`, f32 only) from the same settings.
pub fn table_description(
    dim: usize,
    seed: u64,
    lifecycle: TableLifecycle,
    precision: TablePrecision,
) -> VariableBuilder<i64> {
    let mut table = Variable::<i64>::builder(TABLE_NAME)
        .dim(dim)
        .initializer(row_initializer(seed))
        .restrict_policy(TABLE_POLICY)
        .value_dtype(precision.values)
        .slot_dtype(precision.slots)
        // Adam's m and v beside each row's values: one block per key.
        .inline_slots(2)
        .rounding(precision.rounding);
    if let Some(rows) = lifecycle.capacity {
        table = table.capacity(rows);
    }
    if lifecycle.min_count > 1 {
        table = table.admission(Admission::Exact {
            min_count: lifecycle.min_count,
        });
    }
    table
}

/// The local embedding table for `dim`-wide rows, in `shards` shards, with
/// `lifecycle`'s capacity and admission and `precision`'s dtypes.
pub fn embedding_table(
    dim: usize,
    shards: usize,
    seed: u64,
    lifecycle: TableLifecycle,
    precision: TablePrecision,
) -> dynemb::Result<Variable<i64>> {
    table_description(dim, seed, lifecycle, precision)
        .shards(shards)
        .build()
}

/// Field embeddings (in a table of type `T`) and the MLP on top of them.
pub struct CtrModel<T: EmbeddingStore<Key = i64>> {
    /// The sparse part: one row per (field, id).
    pub embedding: Embedding<T>,
    layers: Vec<Linear>,
    fields: usize,
}

impl<T: EmbeddingStore<Key = i64> + 'static> CtrModel<T> {
    /// A model over `table` for samples of `fields` ids; the MLP's weights
    /// come from `vb` (new ones from a `VarMap`, or loaded).
    pub fn new(table: Arc<T>, vb: VarBuilder, fields: usize) -> dynemb_candle::Result<Self> {
        let dim = table.dim();
        let embedding = Embedding::new(table, EmbeddingConfig::default())?;
        let widths = [fields * dim, HIDDEN[0], HIDDEN[1], 1];
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| candle_nn::linear(w[0], w[1], vb.pp(format!("mlp{i}"))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(CtrModel {
            embedding,
            layers,
            fields,
        })
    }

    /// Click logits `[batch]` for ids `[batch, fields]`. `train` decides
    /// the embedding's mode: a training forward inserts unseen ids and
    /// records the rows for the optimizer step; an inference forward only
    /// reads (unseen ids read their initial rows).
    pub fn forward(&self, ids: &Tensor, train: bool) -> dynemb_candle::Result<Tensor> {
        if ids.rank() != 2 || ids.dim(1)? != self.fields {
            return Err(dynemb_candle::Error::InvalidInput(format!(
                "ids of shape {:?} for a model of {} fields",
                ids.dims(),
                self.fields
            )));
        }
        let mut x = self.embedding.forward_concat(ids, train)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        Ok(x.squeeze(1)?)
    }
}

/// Salt of the MLP's initializer stream, so that it differs from the other
/// streams drawn from the same seed.
const MLP_SALT: u64 = 0x6d6c_705f_696e_6974;

/// Overwrites every variable of `mlp` (the `mlpN.weight` and `mlpN.bias` of
/// [`CtrModel::new`]) with values drawn like `candle_nn::linear`'s defaults
/// (candle-nn 0.11 `linear.rs`): a weight `[out, in]` from candle-nn's
/// `DEFAULT_KAIMING_NORMAL`, normal with mean 0 and standard deviation
/// `sqrt(2 / in)`; a bias uniform in `±1 / sqrt(in)` of its layer's weight.
/// The values come from one PCG stream seeded by `seed`, through the
/// variables in name order, so equal seeds give bit-identical MLPs. A
/// variable of another name is an error.
pub fn init_mlp(mlp: &VarMap, seed: u64) -> candle_core::Result<()> {
    let vars: HashMap<String, Var> = mlp
        .data()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let mut rng = Pcg64Mcg::seed_from_u64(seed ^ MLP_SALT);
    for name in names {
        let var = &vars[name];
        let (layer, weight) = match (name.strip_suffix(".weight"), name.strip_suffix(".bias")) {
            (Some(layer), _) => (layer, true),
            (None, Some(layer)) => (layer, false),
            (None, None) => candle_core::bail!("init_mlp: {name} is neither a weight nor a bias"),
        };
        let Some(layer_weight) = vars.get(&format!("{layer}.weight")) else {
            candle_core::bail!("init_mlp: {name} has no {layer}.weight");
        };
        let fan_in = match layer_weight.dims() {
            [_, fan_in] if *fan_in > 0 => *fan_in as f64,
            dims => candle_core::bail!("init_mlp: {layer}.weight has shape {dims:?}"),
        };
        let count = var.elem_count();
        let values: Vec<f32> = if weight {
            let std = (2.0 / fan_in).sqrt();
            (0..count)
                .map(|_| (std * rng.sample::<f64, _>(StandardNormal)) as f32)
                .collect()
        } else {
            let bound = 1.0 / fan_in.sqrt();
            (0..count)
                .map(|_| rng.random_range(-bound..bound) as f32)
                .collect()
        };
        var.set(&Tensor::from_vec(values, var.shape(), var.device())?)?;
    }
    Ok(())
}

/// The ids of `samples` (row-major `[samples, fields]`) as a tensor.
pub fn ids_tensor(ids: &[i64], fields: usize, device: &Device) -> candle_core::Result<Tensor> {
    Tensor::from_slice(ids, (ids.len() / fields.max(1), fields), device)
}

/// Mean binary cross-entropy of `logits` against `labels` (0 or 1), in the
/// stable form `max(x, 0) - x*y + ln(1 + e^-|x|)` (candle-nn's
/// `binary_cross_entropy_with_logit` takes the log of a sigmoid, which is
/// `-inf` once a logit saturates).
pub fn bce_with_logits(logits: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
    let softplus = logits.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?;
    (logits.relu()? - (logits * labels)? + softplus)?.mean_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_bce_matches_the_definition_and_stays_finite() {
        let dev = Device::Cpu;
        let logits = Tensor::new(&[-2.0_f32, 0.0, 3.0, 200.0, -200.0], &dev).unwrap();
        let labels = Tensor::new(&[0.0_f32, 1.0, 1.0, 0.0, 0.0], &dev).unwrap();
        let loss = bce_with_logits(&logits, &labels)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let by_hand: f64 = [
            (-2.0, 0.0),
            (0.0, 1.0),
            (3.0, 1.0),
            (200.0, 0.0),
            (-200.0, 0.0),
        ]
        .iter()
        .map(|&(x, y): &(f64, f64)| {
            let p = 1.0 / (1.0 + (-x).exp());
            let p = p.clamp(1e-300, 1.0 - 1e-16);
            if y == 1.0 {
                -p.ln()
            } else if x > 30.0 {
                x // -ln(1 - p) for a saturated p
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
            / 5.0;
        assert!(
            (f64::from(loss) - by_hand).abs() < 1e-5,
            "{loss} vs {by_hand}"
        );
    }

    /// A fresh model over 3 fields of width 4, its MLP initialized from
    /// `seed`; its variables by name.
    fn seeded_mlp(seed: u64) -> Vec<(String, Vec<f32>)> {
        let dev = Device::Cpu;
        let table =
            Arc::new(embedding_table(4, 1, 1, TableLifecycle::NONE, TablePrecision::F32).unwrap());
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, candle_core::DType::F32, &dev);
        CtrModel::new(table, vb, 3).unwrap();
        init_mlp(&map, seed).unwrap();
        let mut vars: Vec<(String, Vec<f32>)> = map
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(name, var)| (name.clone(), var.flatten_all().unwrap().to_vec1().unwrap()))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }

    fn bits(vars: &[(String, Vec<f32>)]) -> Vec<(String, Vec<u32>)> {
        vars.iter()
            .map(|(name, values)| (name.clone(), values.iter().map(|v| v.to_bits()).collect()))
            .collect()
    }

    #[test]
    fn seeded_mlp_init_is_reproducible_and_scaled_like_candle_linear() {
        let vars = seeded_mlp(5);
        let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "mlp0.bias",
                "mlp0.weight",
                "mlp1.bias",
                "mlp1.weight",
                "mlp2.bias",
                "mlp2.weight"
            ]
        );
        assert_eq!(bits(&vars), bits(&seeded_mlp(5)), "same seed, other MLP");
        let other = seeded_mlp(6);
        for ((name, a), (_, b)) in vars.iter().zip(&other) {
            assert!(
                a.iter().zip(b).any(|(x, y)| x != y),
                "{name} ignores the seed"
            );
        }
        // Fan-ins: 3 fields x 4 dims, then the hidden widths.
        for (layer, fan_in) in [(0, 12.0), (1, HIDDEN[0] as f64), (2, HIDDEN[1] as f64)] {
            let weight = &vars[2 * layer + 1].1;
            let n = weight.len() as f64;
            let mean = weight.iter().map(|&w| f64::from(w)).sum::<f64>() / n;
            let std = (weight
                .iter()
                .map(|&w| (f64::from(w) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            let want = (2.0 / fan_in).sqrt();
            if weight.len() > 1000 {
                assert!(mean.abs() < 0.1 * want, "layer {layer}: mean {mean}");
                assert!(
                    (std / want - 1.0).abs() < 0.1,
                    "layer {layer}: std {std}, want {want}"
                );
            }
            let bias = &vars[2 * layer].1;
            let bound = (1.0 / fan_in.sqrt()) as f32;
            assert!(
                bias.iter().all(|b| b.abs() <= bound),
                "layer {layer}: bias out of bounds"
            );
            if bias.len() > 100 {
                let widest = bias.iter().fold(0.0f32, |m, b| m.max(b.abs()));
                assert!(
                    widest > 0.9 * bound,
                    "layer {layer}: biases within {widest} of {bound}"
                );
            }
        }
    }

    #[test]
    fn init_mlp_refuses_variables_it_does_not_know() {
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, candle_core::DType::F32, &Device::Cpu);
        vb.get_with_hints(3, "scale", candle_nn::Init::Const(1.0))
            .unwrap();
        let message = init_mlp(&map, 1).unwrap_err().to_string();
        assert!(message.contains("scale is neither"), "{message}");
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, candle_core::DType::F32, &Device::Cpu);
        vb.get_with_hints(3, "lone.bias", candle_nn::Init::Const(0.0))
            .unwrap();
        let message = init_mlp(&map, 1).unwrap_err().to_string();
        assert!(message.contains("has no lone.weight"), "{message}");
    }

    #[test]
    fn forward_gives_one_logit_per_sample_and_inference_inserts_nothing() {
        let dev = Device::Cpu;
        let table =
            Arc::new(embedding_table(4, 2, 1, TableLifecycle::NONE, TablePrecision::F32).unwrap());
        let map = candle_nn::VarMap::new();
        let vb = VarBuilder::from_varmap(&map, candle_core::DType::F32, &dev);
        let model = CtrModel::new(table.clone(), vb, 3).unwrap();
        let ids = ids_tensor(&[1, 2, 3, 4, 5, 6], 3, &dev).unwrap();
        let logits = model.forward(&ids, false).unwrap();
        assert_eq!(logits.dims(), &[2]);
        assert_eq!(table.size(), 0);
        let trained = model.forward(&ids, true).unwrap();
        assert_eq!(table.size(), 6);
        assert_eq!(
            logits.to_vec1::<f32>().unwrap(),
            trained.to_vec1::<f32>().unwrap()
        );
    }
}
