//! `compare`: dynemb, its peers and the dense references on one workload, in
//! one process, one system after another.
//!
//! ```text
//! cargo run --release -p dynemb-benches --bin compare -- [--keys N] [--dim D[,D..]]
//!     [--threads T[,T..]] [--batch B] [--json FILE] [--quick] [--systems S[,S..]]
//!     [--ops O[,O..]] [--repeats R] [--bounded-ids N] [--bounded-capacity N]
//!     [--bounded-batch B] [--bounded-cost-variants V[,V..]]
//! ```
//!
//! Progress goes to stderr; the report (Markdown tables) to stdout. See the
//! crate docs of `dynemb_benches` for what is measured and how.

use dynemb_benches::cli;
use dynemb_benches::report::{ConfigInfo, Environment, Report, Settings};
use dynemb_benches::suite::{self, Progress};
use std::process::ExitCode;

fn main() -> ExitCode {
    let options = cli::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let plan = options.plan();
    let progress = Progress::new();
    let started = std::time::Instant::now();
    let results = suite::run(&plan, &progress);

    let redis = plan
        .redis
        .map(|shape| dynemb_benches::redis::run(shape, &progress));
    let bounded = plan
        .bounded
        .map(|shape| dynemb_benches::bounded::run(shape, &progress));
    let report = Report {
        settings: Settings {
            configs: plan
                .configs
                .iter()
                .map(|c| ConfigInfo {
                    keys: c.shape.keys,
                    dim: c.shape.dim,
                    batch: c.shape.batch,
                    picks: c.shape.picks,
                    ops: c.ops.clone(),
                })
                .collect(),
            threads: plan.threads.clone(),
            repeats: plan.repeats,
            destructive_repeats: plan.destructive_repeats,
            systems: plan.systems.clone(),
            quick: options.quick,
        },
        environment: Environment::detect(),
        measurements: results.measurements,
        memory: results.memory,
        resize: results.resize,
        checkpoint: results.checkpoint,
        runs: results.runs,
        redis: redis.as_ref().and_then(|r| r.as_ref().ok().cloned()),
        redis_error: redis.and_then(Result::err),
        bounded,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    println!("{}", report.render());
    if let Some(path) = &options.json {
        let json = serde_json::to_string_pretty(&report).expect("report serializes");
        if let Err(e) = std::fs::write(path, json + "\n") {
            eprintln!("compare: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        progress.note(format_args!("wrote {}", path.display()));
    }
    ExitCode::SUCCESS
}
