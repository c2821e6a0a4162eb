//! Running an operation over batches on several threads, and measuring.
//!
//! [`run_split`] divides `0..n` items into one contiguous share per thread,
//! cut at batch boundaries, runs the shares on scoped threads, and returns
//! the wall time from spawning the first thread to joining the last. Each
//! thread gets its own scratch (output buffers), allocated and touched by the
//! caller before the timer starts, so no page fault of a fresh buffer is
//! timed. [`median`] summarizes repeats; [`rss_bytes`] reads the process's
//! resident set from `/proc/self/status`; [`release_free_memory`] hands the
//! allocator's free pages back to the OS between systems, so one system's
//! freed memory neither inflates nor hides the next one's RSS.
//! [`CpuClock`] tells how much CPU other processes used meanwhile: on a
//! shared machine that is the noise in every figure.

use std::ops::Range;
use std::time::{Duration, Instant};

/// `0..n` cut into `parts` contiguous ranges of whole batches (the last
/// batch may be short), as even as batches allow. Empty ranges are dropped
/// when there are fewer batches than parts.
pub fn split(n: usize, parts: usize, batch: usize) -> Vec<Range<usize>> {
    assert!(parts > 0 && batch > 0, "parts and batch must be positive");
    let batches = n.div_ceil(batch);
    (0..parts)
        .map(|p| {
            let start = (batches * p / parts * batch).min(n);
            let end = (batches * (p + 1) / parts * batch).min(n);
            start..end
        })
        .filter(|r| !r.is_empty())
        .collect()
}

/// The batches of `range`, each at most `batch` long.
pub fn batches(range: Range<usize>, batch: usize) -> impl Iterator<Item = Range<usize>> {
    range
        .clone()
        .step_by(batch.max(1))
        .map(move |start| start..(start + batch).min(range.end))
}

/// Runs `work(scratch, share)` for the shares of [`split`]`(n,
/// scratch.len(), batch)`, one scoped thread each; returns the wall time.
pub fn run_split<S, F>(scratch: &mut [S], n: usize, batch: usize, work: F) -> Duration
where
    S: Send,
    F: Fn(&mut S, Range<usize>) + Sync,
{
    let shares = split(n, scratch.len(), batch);
    let work = &work;
    let start = Instant::now();
    std::thread::scope(|s| {
        for (scratch, share) in scratch.iter_mut().zip(shares) {
            s.spawn(move || work(scratch, share));
        }
    });
    start.elapsed()
}

/// Items per second of `items` done in `elapsed`.
pub fn rate(items: usize, elapsed: Duration) -> f64 {
    items as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The median of `xs` (the mean of the two middle values for an even
/// count); NaN for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// The `q` quantile (0..=1) of `xs` by nearest rank; NaN for none.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() {
        return f64::NAN;
    }
    let rank = (q.clamp(0.0, 1.0) * (xs.len() - 1) as f64).round() as usize;
    xs[rank]
}

/// Resident set size of this process in bytes (`VmRSS` of
/// `/proc/self/status`), or `None` where that file does not exist.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

/// `VmRSS` of a `/proc/<pid>/status` text, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Returns the allocator's free memory to the OS, so RSS measured next
/// counts only live memory ([`dynemb::raw::release_free_heap`]).
pub fn release_free_memory() {
    dynemb::raw::release_free_heap();
}

/// Clock ticks per second of `/proc/stat` and `/proc/self/stat` (Linux's
/// `USER_HZ`, 100 on every mainstream architecture).
const USER_HZ: f64 = 100.0;

/// CPU time used so far by the whole machine and by this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuClock {
    /// Busy CPU-seconds of every CPU (`/proc/stat`: user, nice, system,
    /// irq, softirq, steal).
    pub machine: f64,
    /// CPU-seconds of this process, all threads (user + system).
    pub ours: f64,
}

impl CpuClock {
    /// Reads the clock, or `None` where `/proc` is not available.
    pub fn now() -> Option<CpuClock> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Some(CpuClock {
            machine: parse_machine_busy(&stat)?,
            ours: parse_own_cpu(&own)?,
        })
    }

    /// CPU-seconds other processes (and the kernel's own threads) used
    /// since `earlier`.
    pub fn others_since(&self, earlier: &CpuClock) -> f64 {
        ((self.machine - earlier.machine) - (self.ours - earlier.ours)).max(0.0)
    }
}

/// Busy CPU-seconds from the `cpu` line of `/proc/stat`.
fn parse_machine_busy(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    // (guest time is already counted in user).
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| ticks.get(i).copied().unwrap_or(0))
        .sum::<u64>();
    Some(busy as f64 / USER_HZ)
}

/// utime + stime of a `/proc/<pid>/stat` text, in seconds.
fn parse_own_cpu(stat: &str) -> Option<f64> {
    // Fields after the command name (which is in parentheses and may hold
    // spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn split_covers_everything_at_batch_boundaries() {
        for (n, parts, batch) in [
            (100, 2, 10),
            (105, 2, 10),
            (7, 3, 10),
            (64, 4, 8),
            (0, 2, 4),
        ] {
            let shares = split(n, parts, batch);
            assert!(shares.len() <= parts);
            let mut next = 0;
            for s in &shares {
                assert_eq!(s.start, next, "{n} {parts} {batch}: {shares:?}");
                assert!(s.start % batch == 0);
                next = s.end;
            }
            assert_eq!(next, n, "{n} {parts} {batch}: {shares:?}");
        }
        assert_eq!(split(100, 2, 10), vec![0..50, 50..100]);
    }

    #[test]
    fn batches_cover_a_range() {
        let b: Vec<_> = batches(5..28, 10).collect();
        assert_eq!(b, vec![5..15, 15..25, 25..28]);
        assert_eq!(batches(3..3, 10).count(), 0);
    }

    #[test]
    fn run_split_gives_each_thread_its_share_and_scratch() {
        let seen = AtomicUsize::new(0);
        let mut scratch = vec![Vec::new(), Vec::new()];
        run_split(&mut scratch, 1000, 64, |mine: &mut Vec<usize>, share| {
            seen.fetch_add(share.len(), Ordering::Relaxed);
            mine.push(share.start);
        });
        assert_eq!(seen.into_inner(), 1000);
        assert_eq!(scratch, vec![vec![0], vec![512]]);
    }

    #[test]
    fn median_and_quantile() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let xs: Vec<f64> = (0..=100).map(f64::from).collect();
        assert_eq!(quantile(&xs, 0.99), 99.0);
        assert_eq!(quantile(&xs, 1.0), 100.0);
        assert_eq!(quantile(&xs, 0.0), 0.0);
    }

    #[test]
    fn cpu_clock_parses() {
        let stat = "cpu  100 50 30 1000 7 2 3 4 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(parse_machine_busy(stat), Some(1.89));
        let own = "42 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(parse_own_cpu(own), Some(3.0));
        let a = CpuClock {
            machine: 10.0,
            ours: 4.0,
        };
        let b = CpuClock {
            machine: 15.0,
            ours: 7.0,
        };
        assert_eq!(b.others_since(&a), 2.0);
        if cfg!(target_os = "linux") {
            assert!(CpuClock::now().is_some());
        }
    }

    #[test]
    fn rss_parses_and_is_positive_here() {
        assert_eq!(
            parse_vm_rss("Name:\tx\nVmRSS:\t  1234 kB\nVmSwap: 0 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        if cfg!(target_os = "linux") {
            assert!(rss_bytes().unwrap() > 0);
        }
    }
}
