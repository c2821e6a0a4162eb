//! The targets, checked against the figures of the run.
//!
//! The targets are stated for dim 64, 8M keys and 2 threads; they are checked
//! on the main configuration of whatever run this is, at 2 threads if 2 was
//! measured (else the most threads measured), and export on one thread.
//! Every verdict is computed from the measured numbers; a target whose
//! figures were not measured (a system left out) is "not measured".
//!
//! The optimizer-step targets use `SparseAdam`'s step on uniform picks
//! (dynemb's `accum`, their reference, is measured on uniform picks too);
//! [`apply_ratios`] gives the same three ratios for every measured dim,
//! thread count and both pick distributions, Zipf included, for the report.

use crate::report::{Figures, Measurement, MemoryRow, ResizeRow};
use crate::systems::{Op, System};
use serde::Serialize;

/// How a target's numbers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A ratio, shown as `1.23x`.
    Ratio,
    /// Items per second, shown in millions.
    PerSecond,
}

impl Unit {
    /// `v` in this unit.
    pub fn format(self, v: f64) -> String {
        match self {
            Unit::Ratio => format!("{v:.3}x"),
            Unit::PerSecond => format!("{:.1}M/s", v / 1e6),
        }
    }
}

/// One target and its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value, if measured.
    pub measured: Option<f64>,
    /// The goal.
    pub goal: f64,
    /// True if the measured value must be at most the goal (else at least).
    pub at_most: bool,
    /// How to read `measured` and `goal`.
    pub unit: Unit,
    /// Whether the goal was met; `None` if not measured.
    pub met: Option<bool>,
}

impl Target {
    fn new(name: String, measured: Option<f64>, goal: f64, at_most: bool, unit: Unit) -> Self {
        let met = measured
            .filter(|v| !v.is_nan())
            .map(|v| if at_most { v <= goal } else { v >= goal });
        Target {
            name,
            measured,
            goal,
            at_most,
            unit,
            met,
        }
    }

    fn at_least(name: impl Into<String>, measured: Option<f64>, goal: f64, unit: Unit) -> Self {
        Target::new(name.into(), measured, goal, false, unit)
    }

    fn at_most(name: impl Into<String>, measured: Option<f64>, goal: f64) -> Self {
        Target::new(name.into(), measured, goal, true, Unit::Ratio)
    }
}

/// Checks every target on the main configuration's figures `f` at
/// `threads`, with its resize and memory rows.
pub fn check(
    f: &Figures<'_>,
    threads: usize,
    resize: &[ResizeRow],
    memory: &[MemoryRow],
) -> Vec<Target> {
    let t = threads;
    let dynemb = |op| f.get(System::Dynemb, op, t);
    let vs_peer = |label: &str, op, goal| {
        Target::at_least(
            format!("{label} ({t} threads): dynemb / best peer"),
            f.vs_best_peer(op, t),
            goal,
            Unit::Ratio,
        )
    };
    let vs_dense = |label: &str, op, goal| {
        Target::at_least(
            format!("{label} ({t} threads): dynemb / dense"),
            f.vs_dense(op, t),
            goal,
            Unit::Ratio,
        )
    };
    let ours_resize = resize
        .iter()
        .find(|r| r.system == System::Dynemb && r.dim == f.dim && r.keys == f.keys);
    let ours_memory = memory
        .iter()
        .find(|m| m.system == System::Dynemb && m.dim == f.dim && m.keys == f.keys);
    let per_raw = |v: Option<f64>| ours_memory.and_then(|m| Some(v? / m.raw_bytes_per_row));

    vec![
        Target::at_least(
            format!("lookup hit ({t} threads): dynemb / best of dashmap, papaya, scc"),
            f.vs_best_concurrent_map(Op::LookupHit, t),
            4.0,
            Unit::Ratio,
        ),
        vs_dense("lookup hit", Op::LookupHit, 0.6),
        Target::at_least(
            format!("lookup miss, constant init ({t} threads): dynemb miss / dynemb hit"),
            dynemb(Op::LookupMissConstant)
                .zip(dynemb(Op::LookupHit))
                .map(|(m, h)| m / h),
            1.0,
            Unit::Ratio,
        ),
        vs_peer("upsert existing", Op::Upsert, 3.0),
        vs_dense("upsert existing", Op::Upsert, 0.5),
        vs_peer("accumulate", Op::Accum, 3.0),
        vs_dense("accumulate", Op::Accum, 0.5),
        vs_peer("insert new keys, through resizes", Op::Insert, 3.0),
        vs_peer("remove", Op::Remove, 3.0),
        Target::at_least(
            "export (1 thread): dynemb rows/s",
            f.get(System::Dynemb, Op::Export, 1),
            20e6,
            Unit::PerSecond,
        ),
        Target::at_most(
            "resize under load: reader's worst batch / median batch",
            ours_resize.map(|r| r.worst_over_median),
            10.0,
        ),
        Target::at_least(
            format!("apply SparseAdam, uniform ({t} threads): dynemb / dynemb's accum"),
            adam_over_accum(f, Op::ApplyAdam, t),
            0.5,
            Unit::Ratio,
        ),
        Target::at_least(
            format!(
                "apply SparseAdam, uniform ({t} threads): dynemb / best of dashmap, papaya, scc"
            ),
            f.vs_best_concurrent_map(Op::ApplyAdam, t),
            3.0,
            Unit::Ratio,
        ),
        vs_dense("apply SparseAdam, uniform", Op::ApplyAdam, 0.4),
        Target::at_most(
            "memory: memory_bytes per row / raw bytes per row",
            per_raw(ours_memory.and_then(|m| m.reported_bytes_per_row)),
            1.2,
        ),
        Target::at_most(
            "memory: RSS growth per row (right after growing) / raw bytes per row",
            per_raw(ours_memory.and_then(|m| m.rss_bytes_per_row)),
            1.2,
        ),
    ]
}

/// dynemb's `SparseAdam` step (`op`: uniform or Zipf picks) / dynemb's
/// `accum` (uniform picks), at `threads`.
fn adam_over_accum(f: &Figures<'_>, op: Op, threads: usize) -> Option<f64> {
    Some(f.get(System::Dynemb, op, threads)? / f.get(System::Dynemb, Op::Accum, threads)?)
}

/// The optimizer-step targets' three ratios for one dim, pick distribution
/// and thread count.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyRatio {
    /// Values per row.
    pub dim: usize,
    /// Keys in the table.
    pub keys: usize,
    /// Zipf picks (else uniform).
    pub zipf: bool,
    /// Threads.
    pub threads: usize,
    /// dynemb's `SparseAdam` step / dynemb's `accum` (uniform picks, the
    /// same configuration; `None` where accum was not measured).
    pub adam_over_accum: Option<f64>,
    /// dynemb / the best of dashmap, papaya and scc, `SparseAdam` step.
    pub vs_best_map: Option<f64>,
    /// dynemb / the dense reference, `SparseAdam` step.
    pub vs_dense: Option<f64>,
}

/// The three ratios for every (dim, keys) of `configs` where dynemb's
/// `SparseAdam` step was measured, at each of `threads`, uniform then Zipf.
pub fn apply_ratios(
    measurements: &[Measurement],
    configs: &[(usize, usize)],
    threads: &[usize],
) -> Vec<ApplyRatio> {
    let mut out = Vec::new();
    for &(dim, keys) in configs {
        let f = Figures {
            measurements,
            dim,
            keys,
        };
        for zipf in [false, true] {
            let op = if zipf {
                Op::ApplyAdamZipf
            } else {
                Op::ApplyAdam
            };
            for &t in threads {
                if f.get(System::Dynemb, op, t).is_none() {
                    continue;
                }
                out.push(ApplyRatio {
                    dim,
                    keys,
                    zipf,
                    threads: t,
                    adam_over_accum: adam_over_accum(&f, op, t),
                    vs_best_map: f.vs_best_concurrent_map(op, t),
                    vs_dense: f.vs_dense(op, t),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Shape;

    fn shape() -> Shape {
        Shape {
            keys: 100,
            dim: 64,
            batch: 10,
            picks: 10,
            zipf_s: 1.1,
            seed: 0,
        }
    }

    fn m(system: System, op: Op, v: f64) -> Measurement {
        Measurement::new(&shape(), op, 2, system, vec![v])
    }

    #[test]
    fn verdicts_follow_the_numbers() {
        let ms = vec![
            m(System::Dynemb, Op::LookupHit, 10e6),
            m(System::Dynemb, Op::LookupMissConstant, 12e6),
            m(System::DashMap, Op::LookupHit, 2e6),
            m(System::Scc, Op::LookupHit, 3e6),
            m(System::HashbrownRwLock, Op::LookupHit, 9e6),
            m(System::Dense, Op::LookupHit, 20e6),
            m(System::Dynemb, Op::Upsert, 9e6),
            m(System::Papaya, Op::Upsert, 3e6),
            m(System::Dynemb, Op::Accum, 8e6),
            m(System::Dynemb, Op::ApplyAdam, 5e6),
            m(System::DashMap, Op::ApplyAdam, 1e6),
            m(System::Scc, Op::ApplyAdam, 2e6),
            m(System::Dense, Op::ApplyAdam, 10e6),
            m(System::Dynemb, Op::ApplyAdamZipf, 6e6),
            m(System::Dense, Op::ApplyAdamZipf, 8e6),
        ];
        let f = Figures {
            measurements: &ms,
            dim: 64,
            keys: 100,
        };
        let memory = [MemoryRow::new(
            System::Dynemb,
            &shape(),
            Some(26_400 * 13 / 10),
            None,
            None,
            1.0,
        )];
        let resize = [ResizeRow::new(
            System::Dynemb,
            &shape(),
            &[1.0, 5.0, 50.0],
            &[0, 10, 20],
            1.0,
            None,
        )];
        let targets = check(&f, 2, &resize, &memory);
        let get = |prefix: &str| {
            targets
                .iter()
                .find(|t| t.name.starts_with(prefix))
                .unwrap_or_else(|| panic!("{prefix}"))
        };
        let hit = get("lookup hit (2 threads): dynemb / best of dashmap, papaya, scc");
        assert_eq!(
            hit.measured,
            Some(10.0 / 3.0),
            "hashbrown+RwLock is left out"
        );
        assert_eq!(hit.met, Some(false));
        assert_eq!(
            get("lookup hit (2 threads): dynemb / dense").met,
            Some(false)
        );
        assert_eq!(get("lookup miss").measured, Some(1.2));
        assert_eq!(get("lookup miss").met, Some(true));
        assert_eq!(
            get("upsert existing (2 threads): dynemb / best peer").met,
            Some(true)
        );
        assert_eq!(get("accumulate").met, None, "not measured");
        let own = get("apply SparseAdam, uniform (2 threads): dynemb / dynemb's accum");
        assert_eq!((own.measured, own.met), (Some(5.0 / 8.0), Some(true)));
        let maps = get("apply SparseAdam, uniform (2 threads): dynemb / best of");
        assert_eq!((maps.measured, maps.met), (Some(2.5), Some(false)));
        let dense = get("apply SparseAdam, uniform (2 threads): dynemb / dense");
        assert_eq!((dense.measured, dense.met), (Some(0.5), Some(true)));

        let ratios = apply_ratios(&ms, &[(64, 100), (16, 100)], &[1, 2]);
        assert_eq!(ratios.len(), 2, "dim 64, 2 threads, uniform and zipf");
        assert!(!ratios[0].zipf && ratios[1].zipf);
        assert_eq!(ratios[1].adam_over_accum, Some(6.0 / 8.0));
        assert_eq!(ratios[1].vs_best_map, None, "no peer measured on zipf");
        assert_eq!(ratios[1].vs_dense, Some(0.75));
        assert_eq!(get("resize").measured, Some(10.0));
        assert_eq!(get("resize").met, Some(true), "10x is within <= 10x");
        let mem = get("memory: memory_bytes");
        assert!((mem.measured.unwrap() - 1.3).abs() < 1e-9);
        assert_eq!(mem.met, Some(false));
        assert_eq!(get("memory: RSS").met, None);
    }
}
