//! The standard `process_*` series of Prometheus client libraries, read from `/proc`
//! (Linux; elsewhere only `process_start_time_seconds`): CPU time, resident and
//! virtual memory, open and maximum file descriptors, threads, start time.

use std::fmt::Write as _;
use std::sync::OnceLock;

/// When the process started, unix seconds (taken at the first call: the proxy calls
/// it when the registry is created, at start).
pub(super) fn start_time_secs() -> f64 {
    static START: OnceLock<f64> = OnceLock::new();
    *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    })
}

/// The `process_*` families.
pub(super) fn render(out: &mut String) {
    #[cfg(target_os = "linux")]
    linux::render(out);
    let _ = writeln!(
        out,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}",
        start_time_secs()
    );
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fmt::Write as _;

    /// Clock ticks per second of `/proc/self/stat`'s CPU times (`USER_HZ`, 100 on
    /// every Linux architecture keypool runs on).
    const TICKS_PER_SEC: f64 = 100.0;
    /// Bytes per page of `statm` (4 KiB on x86-64 and arm64 with 4 KiB pages).
    const PAGE_BYTES: u64 = 4096;

    pub(super) fn render(out: &mut String) {
        if let Some(stat) = read_stat() {
            let _ = writeln!(
                out,
                "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}",
                stat.cpu_ticks as f64 / TICKS_PER_SEC
            );
            let _ = writeln!(
                out,
                "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes {}",
                stat.vsize
            );
            let _ = writeln!(
                out,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}",
                stat.rss_pages * PAGE_BYTES
            );
            let _ = writeln!(
                out,
                "# HELP process_threads Number of OS threads in the process.\n# TYPE process_threads gauge\nprocess_threads {}",
                stat.threads
            );
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let _ = writeln!(
                out,
                "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}",
                // the directory handle itself is one of them
                fds.count().saturating_sub(1)
            );
        }
        if let Some(max) = max_fds() {
            let _ = writeln!(
                out,
                "# HELP process_max_fds Maximum number of open file descriptors.\n# TYPE process_max_fds gauge\nprocess_max_fds {max}"
            );
        }
    }

    struct Stat {
        cpu_ticks: u64,
        threads: u64,
        vsize: u64,
        rss_pages: u64,
    }

    /// `/proc/self/stat`: fields after the command name (which may hold spaces and
    /// parentheses, so the line is split after its last `)`).
    fn read_stat() -> Option<Stat> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // rest starts at field 3 (state): utime is field 14, i.e. index 11 here
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        Some(Stat {
            cpu_ticks: field(14)? + field(15)?,
            threads: field(20)?,
            vsize: field(23)?,
            rss_pages: field(24)?,
        })
    }

    /// The soft limit of open files, from `/proc/self/limits`.
    fn max_fds() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/limits").ok()?;
        let line = text.lines().find(|l| l.starts_with("Max open files"))?;
        line.split_whitespace().nth(3)?.parse().ok()
    }
}
