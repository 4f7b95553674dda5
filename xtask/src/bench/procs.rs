//! Child processes of the benchmark (simulators, gateways) and what `/proc` says about
//! them. Every child runs in its own process group and is killed, group and all, when
//! its [`Proc`] is dropped: on success, on error and on panic.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running child process (and its process group), killed on drop.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` in a new process group with stdout and stderr into `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("cannot reopen {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    /// The process id, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails, with the end of its log, if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait().context("cannot query a child")? {
            bail!(
                "{} exited ({status}); end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// Sends `SIGTERM` to the process (not its group) and waits up to `limit` for it to
    /// exit by itself (a server that drains, or a profiled binary that must write its
    /// counts at exit); its exit status.
    pub fn terminate(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed ({status})", self.pid());
        }
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().context("cannot query a child")? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not exit within {limit:?} of SIGTERM; end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// CPU ticks and peak RSS of every process of its group.
    pub fn usage(&self) -> Usage {
        group_usage(self.pid())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // The whole group: LiteLLM's workers, npm's node, etc. `kill` the program keeps
        // this crate free of unsafe code and of a libc dependency.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of a log file (or why it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read: {e})"),
    }
}

/// CPU and memory of a process group, read from `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// `utime + stime` summed over the group, clock ticks.
    pub cpu_ticks: u64,
    /// `VmHWM` summed over the group, KiB.
    pub peak_rss_kib: u64,
    /// Live (not zombie) processes in the group.
    pub processes: u32,
}

/// One process as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Process group.
    pub pgrp: u32,
    /// `utime + stime`, clock ticks.
    pub ticks: u64,
}

/// The machine's CPU time as the first line of `/proc/stat` counts it, clock ticks
/// summed over every CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineTicks {
    /// `user + nice + system + irq + softirq`: running something.
    pub busy: u64,
    /// `idle + iowait`: nothing to run.
    pub idle: u64,
    /// `steal`: the hypervisor ran someone else.
    pub steal: u64,
}

impl MachineTicks {
    /// Every tick counted.
    pub fn total(self) -> u64 {
        self.busy + self.idle + self.steal
    }

    /// What was counted from `before` to `self`.
    pub fn since(self, before: Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(before.busy),
            idle: self.idle.saturating_sub(before.idle),
            steal: self.steal.saturating_sub(before.steal),
        }
    }
}

/// Parses the `cpu` line of `/proc/stat` (`cpu user nice system idle iowait irq softirq
/// steal …`; a kernel that counts fewer fields counts the rest as 0).
pub fn parse_machine_ticks(proc_stat: &str) -> Option<MachineTicks> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    if fields.len() < 4 {
        return None;
    }
    Some(MachineTicks {
        busy: at(0) + at(1) + at(2) + at(5) + at(6),
        idle: at(3) + at(4),
        steal: at(7),
    })
}

/// The machine's CPU time so far ([`parse_machine_ticks`]); `None` where `/proc/stat`
/// cannot be read.
pub fn machine_ticks() -> Option<MachineTicks> {
    parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// `utime + stime` of this process (every thread of it), clock ticks.
pub fn own_ticks() -> Option<u64> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?).map(|s| s.ticks)
}

/// Parses the text of `/proc/PID/stat`. The command name (field 2) may contain spaces
/// and parentheses, so fields are counted after its last `)`.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) … utime(14) stime(15).
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Stat {
        state,
        pgrp,
        ticks: utime + stime,
    })
}

/// `VmHWM` in KiB from the text of `/proc/PID/status`.
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Sums CPU ticks and `VmHWM` over every live process whose process group is `pgid`
/// (zombies, which no longer run, are left out).
pub fn group_usage(pgid: u32) -> Usage {
    let mut usage = Usage::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return usage;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(st) = parse_stat(&stat) else {
            continue;
        };
        if st.pgrp != pgid || st.state == 'Z' {
            continue;
        }
        usage.processes += 1;
        usage.cpu_ticks += st.ticks;
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            usage.peak_rss_kib += parse_vm_hwm(&status).unwrap_or(0);
        }
    }
    usage
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's value, if that fails).
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
    listener.local_addr().context("no local address")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_ticks_are_split_into_busy_idle_and_stolen() {
        let text = "cpu  100 2 30 400 5 6 7 8 0 0\ncpu0 50 1 15 200 2 3 3 4 0 0\nintr 1 2\n";
        let t = parse_machine_ticks(text).unwrap();
        assert_eq!(
            t,
            MachineTicks {
                busy: 100 + 2 + 30 + 6 + 7,
                idle: 400 + 5,
                steal: 8,
            }
        );
        assert_eq!(t.total(), 145 + 405 + 8);
        let later = MachineTicks {
            busy: 200,
            idle: 405,
            steal: 10,
        };
        assert_eq!(
            later.since(t),
            MachineTicks {
                busy: 55,
                idle: 0,
                steal: 2,
            }
        );
        // an old kernel's four fields
        assert_eq!(
            parse_machine_ticks("cpu 1 2 3 4\n").unwrap(),
            MachineTicks {
                busy: 6,
                idle: 4,
                steal: 0,
            }
        );
        assert_eq!(parse_machine_ticks("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_machine_ticks("cpu 1 x 3 4\n"), None);
        assert_eq!(parse_machine_ticks("cpu 1 2 3\n"), None);
    }

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let stat =
            "4242 (tokio (rt) x) S 1 4240 4240 0 -1 4194560 500 0 0 0 1234 56 0 0 20 0 3 0 100 0 0";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                state: 'S',
                pgrp: 4240,
                ticks: 1290
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[test]
    fn vm_hwm_is_read_in_kib() {
        let status = "Name:\tkeypool\nVmPeak:\t  999 kB\nVmHWM:\t   20480 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(20480));
        assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
    }

    #[test]
    fn own_process_is_seen_in_proc() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_stat(&stat).is_some());
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_vm_hwm(&status).unwrap() > 0);
    }

    #[test]
    fn dropping_a_proc_kills_its_group() {
        let dir = std::env::temp_dir().join(format!("xtask-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sh");
        // A child of the child: it must die too.
        cmd.args(["-c", "sleep 30 & sleep 30 & wait"]);
        let mut p = Proc::spawn("sleeper", cmd, &dir.join("log")).unwrap();
        p.check_alive().unwrap();
        let pgid = p.pid();
        // Both sleeps (and sh) are up once the group has three processes.
        for _ in 0..200 {
            if group_usage(pgid).processes == 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(group_usage(pgid).processes, 3);
        drop(p);
        // SIGKILL is delivered at once, but the orphaned sleep may take a moment to go.
        for _ in 0..200 {
            if group_usage(pgid).processes == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(group_usage(pgid).processes, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_exited_child_is_reported_with_its_log() {
        let dir = std::env::temp_dir().join(format!("xtask-procs-exit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom; exit 3"]);
        let mut p = Proc::spawn("failing", cmd, &dir.join("log")).unwrap();
        let _ = p.child.wait();
        let err = p.check_alive().unwrap_err().to_string();
        assert!(err.contains("failing exited"), "{err}");
        assert!(err.contains("boom"), "{err}");
        drop(p);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
