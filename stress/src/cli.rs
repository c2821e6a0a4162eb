//! The `soak` binary's flags.
//!
//! ```text
//! soak --duration D [--threads N] [--dim D] [--dir PATH] [--keys N] [--shards S]
//!      [--batch B] [--policy frequency|timestamp] [--checkpoint-every D]
//!      [--audit-every D] [--progress-every D] [--ledger-keys N] [--seed S]
//!      [--max-rss-gib G] [--keep-checkpoints] [--capacity N] [--expire-every D]
//! ```
//!
//! Durations are a number with a unit, or several (`90s`, `30m`, `1h30m`,
//! `500ms`); a bare number is seconds.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use dynemb::RestrictPolicy;
use std::path::PathBuf;
use std::time::Duration;

/// The parsed command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "soak",
    about = "A long mixed-load soak of dynemb's Variable that checks exact invariants as it runs",
    long_about = None
)]
pub struct Options {
    /// How long to run the load (e.g. 60s, 30m, 1h30m).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub duration: Duration,
    /// Worker threads (default: available parallelism, at least 2).
    #[arg(long, value_name = "N", value_parser = positive, default_value_t = default_threads(), hide_default_value = true)]
    pub threads: usize,
    /// Values per row.
    #[arg(long, value_name = "D", value_parser = positive, default_value_t = 16)]
    pub dim: usize,
    /// Checkpoint directory (default <workspace>/target/soak).
    #[arg(long, value_name = "PATH", default_value_os_t = default_dir(), hide_default_value = true)]
    pub dir: PathBuf,
    /// Target size of the main variable: it grows to N keys, then churns
    /// between 0.9 N and 1.1 N (at least 1000).
    #[arg(long, value_name = "N", value_parser = keys, default_value_t = 3_000_000)]
    pub keys: usize,
    /// Shards of the main variable.
    #[arg(long, value_name = "S", value_parser = positive, default_value_t = 8)]
    pub shards: usize,
    /// Keys per batch.
    #[arg(long, value_name = "B", value_parser = positive, default_value_t = 1024)]
    pub batch: usize,
    /// Restrict policy of the main variable.
    #[arg(
        long,
        value_name = "P",
        default_value = "frequency",
        value_parser = PossibleValuesParser::new(["frequency", "timestamp"])
            .map(|s| RestrictPolicy::from_name(&s).expect("a listed name")),
    )]
    pub policy: RestrictPolicy,
    /// Pause between checkpoint rounds.
    #[arg(long, value_name = "D", value_parser = parse_duration, default_value = "20s")]
    pub checkpoint_every: Duration,
    /// Pause between whole-table audits (longer than zero).
    #[arg(long, value_name = "D", value_parser = nonzero_duration, default_value = "60s")]
    pub audit_every: Duration,
    /// Pause between progress lines (longer than zero).
    #[arg(long, value_name = "D", value_parser = nonzero_duration, default_value = "10s")]
    pub progress_every: Duration,
    /// Ledger keys per kind, update_rows and accum (at most 16777216).
    #[arg(long, value_name = "N", value_parser = ledger_keys, default_value_t = 1 << 15)]
    pub ledger_keys: usize,
    /// Seed of the threads' random choices.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,
    /// Fail if the process's RSS exceeds G GiB.
    #[arg(long, value_name = "G", value_parser = positive_number, default_value_t = 6.0)]
    pub max_rss_gib: f64,
    /// Leave the checkpoints in --dir at the end (default: removed).
    #[arg(long)]
    pub keep_checkpoints: bool,
    /// Also train a bounded variable of N rows (at least one per shard)
    /// with an eviction listener and expiry, whose books account for every
    /// row (see the `bounded` module).
    #[arg(long, value_name = "N", value_parser = positive)]
    pub capacity: Option<usize>,
    /// Pause between two `expire` calls on the bounded variable (longer
    /// than zero).
    #[arg(long, value_name = "D", value_parser = nonzero_duration, default_value = "1s")]
    pub expire_every: Duration,
}

/// The default of `--threads`: the available parallelism, at least 2.
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2)
        .max(2)
}

/// The default checkpoint directory: `target/soak` of the workspace.
fn default_dir() -> PathBuf {
    let stress = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    stress
        .parent()
        .unwrap_or(stress)
        .join("target")
        .join("soak")
}

/// A positive integer; `_` may separate digits (`3_000_000`).
fn positive(text: &str) -> Result<usize, String> {
    text.replace('_', "")
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "not a positive integer".into())
}

/// A `--keys` value: an integer of at least 1000.
fn keys(text: &str) -> Result<usize, String> {
    let n = positive(text)?;
    if n < 1000 {
        return Err("must be at least 1000".into());
    }
    Ok(n)
}

/// A `--ledger-keys` value: a positive integer of at most 2^24.
fn ledger_keys(text: &str) -> Result<usize, String> {
    let n = positive(text)?;
    if n > 1 << 24 {
        return Err(format!("must be at most {}", 1 << 24));
    }
    Ok(n)
}

/// A positive number, fractions allowed.
fn positive_number(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|g| *g > 0.0)
        .ok_or_else(|| "not a positive number".into())
}

/// A duration longer than zero.
fn nonzero_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// Parses `90`, `90s`, `500ms`, `30m`, `2h`, `1h30m`: numbers each followed
/// by a unit (`ms`, `s`, `m`, `h`); a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 60s, 30m, 1h30m)");
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number * 60),
            "h" => Duration::from_secs(number * 3600),
            _ => return Err(bad()),
        };
        total += part;
        rest = &rest[unit_len..];
    }
    if total.is_zero() && text.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn clap_definition_is_valid() {
        use clap::CommandFactory;
        Options::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Options, String> {
        Options::try_parse_from(std::iter::once("soak").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_parse() {
        let options = parse(&[
            "--duration",
            "2m",
            "--threads",
            "3",
            "--policy",
            "timestamp",
        ])
        .unwrap();
        assert_eq!(options.duration, Duration::from_secs(120));
        assert_eq!(options.threads, 3);
        assert_eq!(options.policy, RestrictPolicy::Timestamp);
        let options = parse(&["--duration", "30m"]).unwrap();
        assert_eq!(options.duration, Duration::from_secs(1800));
        assert!(options.threads >= 2);
        assert_eq!(
            (options.dim, options.keys, options.shards),
            (16, 3_000_000, 8)
        );
        assert_eq!(options.policy, RestrictPolicy::Frequency);
        assert_eq!(options.checkpoint_every, Duration::from_secs(20));
        assert_eq!(options.ledger_keys, 1 << 15);
        assert!(options.dir.ends_with("target/soak"));
        assert!(parse(&["--threads", "2"])
            .unwrap_err()
            .contains("--duration"));
        assert_eq!(options.capacity, None);
        assert_eq!(options.expire_every, Duration::from_secs(1));
        let options = parse(&["--duration", "20s", "--capacity", "50_000"]).unwrap();
        assert_eq!(options.capacity, Some(50_000));
    }

    #[test]
    fn errors_name_the_flag() {
        let err = |args: &[&str]| parse(args).unwrap_err();
        let e = err(&["--duration", "1m", "--keys", "999"]);
        assert!(e.contains("--keys") && e.contains("at least 1000"), "{e}");
        let e = err(&["--duration", "1m", "--ledger-keys", "16777217"]);
        assert!(e.contains("--ledger-keys"), "{e}");
        let e = err(&["--duration", "1m", "--audit-every", "0s"]);
        assert!(e.contains("--audit-every"), "{e}");
        let e = err(&["--duration", "1m", "--policy", "lru"]);
        assert!(e.contains("--policy") && e.contains("'lru'"), "{e}");
        let e = err(&["--duration", "1m", "--max-rss-gib", "0"]);
        assert!(e.contains("--max-rss-gib"), "{e}");
        let e = err(&["--duration", "1m", "--capacity", "0"]);
        assert!(e.contains("--capacity"), "{e}");
        let e = err(&["--duration", "1m", "--expire-every", "0s"]);
        assert!(e.contains("--expire-every"), "{e}");
        let e = err(&["--duration", "soon"]);
        assert!(
            e.contains("--duration") && e.contains("not a duration"),
            "{e}"
        );
    }
}
