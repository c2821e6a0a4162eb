//! The `soak` binary's flags.
//!
//! ```text
//! soak --duration D [--threads N] [--dim D] [--dir PATH] [--keys N] [--shards S]
//!      [--batch B] [--policy frequency|timestamp] [--checkpoint-every D]
//!      [--audit-every D] [--progress-every D] [--ledger-keys N] [--seed S]
//!      [--max-rss-gib G] [--keep-checkpoints]
//! ```
//!
//! Durations are a number with a unit, or several (`90s`, `30m`, `1h30m`,
//! `500ms`); a bare number is seconds.

use dynemb::RestrictPolicy;
use std::path::PathBuf;
use std::time::Duration;

/// Usage text, printed by `--help` and after a flag error.
pub const USAGE: &str = "\
usage: soak --duration D [--threads N] [--dim D] [--dir PATH] [--keys N] [--shards S]
            [--batch B] [--policy frequency|timestamp] [--checkpoint-every D]
            [--audit-every D] [--progress-every D] [--ledger-keys N] [--seed S]
            [--max-rss-gib G] [--keep-checkpoints]

  --duration D          how long to run the load (required; e.g. 60s, 30m, 1h30m)
  --threads N           worker threads (default: available parallelism, at least 2)
  --dim D               values per row (default 16)
  --dir PATH            checkpoint directory (default <workspace>/target/soak)
  --keys N              target size of the main variable: it grows to N keys, then
                        churns between 0.9 N and 1.1 N (default 3000000)
  --shards S            shards of the main variable (default 8)
  --batch B             keys per batch (default 1024)
  --policy P            restrict policy of the main variable (default frequency)
  --checkpoint-every D  pause between checkpoint rounds (default 20s)
  --audit-every D       pause between whole-table audits (default 60s)
  --progress-every D    pause between progress lines (default 10s)
  --ledger-keys N       ledger keys per kind, update_rows and accum (default 32768)
  --seed S              seed of the threads' random choices (default 1)
  --max-rss-gib G       fail if the process's RSS exceeds G GiB (default 6)
  --keep-checkpoints    leave the checkpoints in --dir at the end (default: removed)
  -h, --help            this text";

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--duration`.
    pub duration: Duration,
    /// `--threads`.
    pub threads: usize,
    /// `--dim`.
    pub dim: usize,
    /// `--dir`.
    pub dir: PathBuf,
    /// `--keys`.
    pub keys: usize,
    /// `--shards`.
    pub shards: usize,
    /// `--batch`.
    pub batch: usize,
    /// `--policy`.
    pub policy: RestrictPolicy,
    /// `--checkpoint-every`.
    pub checkpoint_every: Duration,
    /// `--audit-every`.
    pub audit_every: Duration,
    /// `--progress-every`.
    pub progress_every: Duration,
    /// `--ledger-keys`.
    pub ledger_keys: usize,
    /// `--seed`.
    pub seed: u64,
    /// `--max-rss-gib`.
    pub max_rss_gib: f64,
    /// `--keep-checkpoints`.
    pub keep_checkpoints: bool,
}

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Command {
    /// Run the soak with these options.
    Run(Box<Options>),
    /// Print the usage text.
    Help,
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

/// Parses the flags (without the program name).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let threads = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2)
        .max(2);
    let mut duration = None;
    let mut options = Options {
        duration: Duration::ZERO,
        threads,
        dim: 16,
        dir: default_dir(),
        keys: 3_000_000,
        shards: 8,
        batch: 1024,
        policy: RestrictPolicy::Frequency,
        checkpoint_every: Duration::from_secs(20),
        audit_every: Duration::from_secs(60),
        progress_every: Duration::from_secs(10),
        ledger_keys: 1 << 15,
        seed: 1,
        max_rss_gib: 6.0,
        keep_checkpoints: false,
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--duration" => duration = Some(parse_duration(&value()?)?),
            "--threads" => options.threads = positive(&flag, &value()?)?,
            "--dim" => options.dim = positive(&flag, &value()?)?,
            "--dir" => options.dir = PathBuf::from(value()?),
            "--keys" => options.keys = positive(&flag, &value()?)?,
            "--shards" => options.shards = positive(&flag, &value()?)?,
            "--batch" => options.batch = positive(&flag, &value()?)?,
            "--policy" => {
                let name = value()?;
                options.policy = RestrictPolicy::from_name(&name).ok_or_else(|| {
                    format!("--policy: {name:?} is neither frequency nor timestamp")
                })?;
            }
            "--checkpoint-every" => options.checkpoint_every = parse_duration(&value()?)?,
            "--audit-every" => options.audit_every = parse_duration(&value()?)?,
            "--progress-every" => options.progress_every = parse_duration(&value()?)?,
            "--ledger-keys" => options.ledger_keys = positive(&flag, &value()?)?,
            "--seed" => {
                let text = value()?;
                options.seed = text
                    .parse()
                    .map_err(|_| format!("--seed: {text:?} is not an unsigned integer"))?;
            }
            "--max-rss-gib" => {
                let text = value()?;
                options.max_rss_gib = text
                    .parse::<f64>()
                    .ok()
                    .filter(|g| *g > 0.0)
                    .ok_or_else(|| format!("--max-rss-gib: {text:?} is not a positive number"))?;
            }
            "--keep-checkpoints" => options.keep_checkpoints = true,
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    options.duration = duration.ok_or("--duration is required")?;
    if options.keys < 1000 {
        return Err(format!(
            "--keys must be at least 1000, got {}",
            options.keys
        ));
    }
    if options.ledger_keys > 1 << 24 {
        return Err(format!(
            "--ledger-keys must be at most {}, got {}",
            1 << 24,
            options.ledger_keys
        ));
    }
    if options.progress_every.is_zero() || options.audit_every.is_zero() {
        return Err("--progress-every and --audit-every must be longer than zero".into());
    }
    Ok(Command::Run(Box::new(options)))
}

/// A positive integer flag value.
fn positive(flag: &str, text: &str) -> Result<usize, String> {
    text.replace('_', "")
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{flag}: {text:?} is not a positive integer"))
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
    fn flags_parse() {
        let args = [
            "--duration",
            "2m",
            "--threads",
            "3",
            "--policy",
            "timestamp",
        ];
        let Ok(Command::Run(options)) = parse(args.iter().map(|s| s.to_string())) else {
            panic!("should parse");
        };
        assert_eq!(options.duration, Duration::from_secs(120));
        assert_eq!(options.threads, 3);
        assert_eq!(options.policy, RestrictPolicy::Timestamp);
        assert!(parse(["--threads", "2"].iter().map(|s| s.to_string())).is_err());
    }
}
