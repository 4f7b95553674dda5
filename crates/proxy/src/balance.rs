//! Placing connections on the worker threads of [`crate::run_workers`], and moving
//! them while they live.
//!
//! Every worker accepts from the same listening socket, and the kernel hands a new
//! connection to whichever thread asks first. Where a connection should live depends
//! on the load, which a count of connections does not tell:
//! - **Packed while the load is light.** Two workers that are each half idle cost more
//!   CPU per request than one busy one: each goes to sleep in `epoll_wait` and is woken
//!   again more often per request (issue 22, at 16 connections on two vCPUs: 20 % more
//!   waits and 2–4 µs more CPU per request than one worker). nginx is packed the same
//!   way, by accident: its first worker to wake takes a burst of connections whole.
//! - **Spread when a worker is busy.** A worker that runs nearly all the time
//!   (saturated), or that waits for a CPU longer than it runs because other processes
//!   take them (starved), stalls every connection it holds; a second thread serves
//!   part of them, and gets a second share of the CPUs.
//!
//! Each worker measures its own thread every [`WINDOW`] ([`watch_load`]): the share of
//! the window it ran and the share it waited on a run queue, from the kernel's
//! per-thread `schedstat` ([`Load`]). A new connection goes to the lowest-numbered
//! worker that is not busy ([`place`]; a TLS connection, which never moves, by count).
//! Every window a worker also plans its moves ([`plan`]): a busy one sends connections
//! to the least-loaded worker if that one has room, as many as bring the two halfway to
//! each other; the highest-numbered worker holding connections, when its running time
//! and a lower-numbered worker's add up to little, sends all of them there, but only
//! once no worker has been busy for [`CALM`], so that a spread made under load is not
//! undone by the first quiet window. After planning a move a worker waits [`SETTLE`]
//! before it plans again, so that its measured load shows the move first. A connection
//! moves only between two requests, with nothing of the next one read, not while the
//! server drains, and only a plain HTTP/1.1 one ([`crate::h1_server`]): its socket goes
//! through the target's inbox, as an accepted one does (one cross-thread hand-over per
//! move, none per request), and the target serves it from its next request head on.
//! Where the kernel gives no `schedstat` (not Linux, or a kernel that does not count)
//! the loads are unknown, and connections are spread by count, as before the loads were
//! measured: the worker with the fewest open ones takes a new one, and none moves.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// A connection handed from the worker that accepted it to the one that serves it,
/// already counted open there.
pub(crate) type Handed = (std::net::TcpStream, SocketAddr, OpenConnection);

/// How often each worker measures its load and plans its moves.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);
/// How long after any worker was last busy connections may be gathered again.
pub(crate) const CALM: Duration = Duration::from_secs(10);
/// How long a worker that planned a move waits before it plans again (its moving
/// average of the load needs about this long to show the move).
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

/// One worker thread's load over its last windows, in thousandths of the wall time: the
/// share it ran on a CPU and the share it waited on a run queue for one.
///
/// The thresholds, against what was measured on two vCPUs shared with the load
/// generator and the simulator (issue 22): one worker serving 16 or 64 busy
/// connections ran 890–970 and waited 20–130, and served them with less CPU per request
/// and as many requests per second as two workers, which then ran 400–550 and waited
/// 300–410 each; one worker beside two busy loops ran 400 and waited 400–440, and two
/// served 15–30 % more requests there. A worker on a machine of its own that cannot
/// keep up runs ~1000 and waits ~0. Only a thread that ran nearly all the time
/// ([`Load::SATURATED`]) or waited for a CPU at least as long as it ran
/// ([`Load::starved`]) is busy: one that runs 90 % of the time on a machine whose CPUs
/// the other processes use gains nothing from a second thread, which takes its CPU
/// from them; and two threads that wait on each other (the 300–410 above, 0.8–0.9 of
/// what they ran) are not starved by others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    pub(crate) ran: u32,
    pub(crate) waited: u32,
}

impl Load {
    /// Ran at least this much: saturated.
    pub(crate) const SATURATED: u32 = 990;
    /// See [`Load::starved`].
    pub(crate) const STARVED: u32 = 300;
    /// See [`Load::starved`].
    pub(crate) const WANTED: u32 = 700;
    /// A busy worker sends connections only to one that ran and waited less than this.
    pub(crate) const ROOM: u32 = 600;
    /// Two workers whose running shares add up to less than this are gathered.
    pub(crate) const GATHER: u32 = 500;

    /// Saturated or starved: its connections would be served sooner on another thread.
    pub(crate) fn busy(self) -> bool {
        self.ran >= Self::SATURATED || self.starved()
    }

    /// Waited for a CPU at least as long as it ran, at least [`Load::STARVED`] of the
    /// time, while it wanted one at least [`Load::WANTED`] of it.
    pub(crate) fn starved(self) -> bool {
        self.waited >= self.ran && self.waited >= Self::STARVED && self.wanted() >= Self::WANTED
    }

    /// The share it ran or waited to run.
    pub(crate) fn wanted(self) -> u32 {
        self.ran.saturating_add(self.waited)
    }

    fn pack(self) -> u32 {
        (self.ran.min(1000) << 16) | self.waited.min(1000)
    }

    fn unpack(word: u32) -> Option<Self> {
        (word != UNKNOWN).then_some(Self {
            ran: word >> 16,
            waited: word & 0xffff,
        })
    }
}

/// A load not measured (no `schedstat`): placement by count, no moves.
const UNKNOWN: u32 = u32::MAX;

/// The open public connections of each worker, their loads and planned moves, and
/// each worker's inbox.
#[derive(Debug)]
pub(crate) struct AcceptBalance {
    open: Box<[AtomicUsize]>,
    /// Each worker's [`Load`] ([`Load::pack`]); [`UNKNOWN`] until measured.
    load: Box<[AtomicU32]>,
    /// When a worker was last seen busy, in milliseconds since `started` plus one; 0
    /// for never.
    busy_at: AtomicU64,
    started: Instant,
    /// Each worker's planned moves: how many connections to send away, and where
    /// ([`Leaving::pack`]).
    leaving: Box<[AtomicU64]>,
    inboxes: Box<[mpsc::UnboundedSender<Handed>]>,
}

/// A move planned by [`plan`]: `count` connections to worker `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leaving {
    pub(crate) to: usize,
    pub(crate) count: usize,
}

impl Leaving {
    /// Count and target in one word, so that a taker never pairs one plan's count with
    /// another's target.
    fn pack(self) -> u64 {
        ((self.count.min(u32::MAX as usize) as u64) << 32) | (self.to.min(u32::MAX as usize) as u64)
    }

    fn unpack(word: u64) -> Self {
        Self {
            to: (word & u64::from(u32::MAX)) as usize,
            count: (word >> 32) as usize,
        }
    }
}

/// One worker's side of the balance: its index and its inbox.
#[derive(Debug)]
pub(crate) struct WorkerShare {
    pub(crate) balance: Arc<AcceptBalance>,
    pub(crate) me: usize,
    pub(crate) inbox: mpsc::UnboundedReceiver<Handed>,
}

/// Counts a connection as open on its worker until dropped.
#[derive(Debug)]
pub(crate) struct OpenConnection {
    balance: Arc<AcceptBalance>,
    worker: usize,
    /// It came from another worker between two requests: a plain HTTP/1.1 connection
    /// whose next request head is due.
    moved: bool,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.balance.open[self.worker].fetch_sub(1, Ordering::Relaxed);
    }
}

/// The worker a new connection goes to, given the open connections of each: the one
/// with the fewest, `me` (the one that accepted it) when it is among them.
pub(crate) fn least_loaded(open: &[usize], me: usize) -> usize {
    let mine = open.get(me).copied().unwrap_or(usize::MAX);
    open.iter()
        .enumerate()
        .filter(|&(_, &n)| n < mine)
        .min_by_key(|&(i, &n)| (n, i))
        .map_or(me, |(i, _)| i)
}

/// The worker a new connection goes to, given each worker's load and open
/// connections: the lowest-numbered one that is not busy; when all are, the one that
/// wanted the least CPU (then the fewest connections). By count alone
/// ([`least_loaded`]) while any load is unknown, or when the connection can never move
/// (`movable` false: TLS), since packed it would stay where a burst put it.
pub(crate) fn place(load: &[Option<Load>], open: &[usize], me: usize, movable: bool) -> usize {
    let known = load.iter().copied().collect::<Option<Vec<Load>>>();
    let Some(load) = known.filter(|_| movable) else {
        return least_loaded(open, me);
    };
    let n = load.len().min(open.len());
    (0..n)
        .find(|&i| !load[i].busy())
        .or_else(|| (0..n).min_by_key(|&i| (load[i].wanted(), open[i], i)))
        .unwrap_or(me)
}

/// What worker `me` does with its connections this window, given each worker's load
/// and open connections: `None` to keep them.
/// - Busy: to the worker that wanted the least CPU, when that one has room
///   ([`Load::ROOM`]), as many as bring the two halfway to each other (a connection
///   weighing its share of this worker's load; none when one connection weighs more
///   than half the gap, so that the two never swap places).
/// - Else, when `calm` (no worker busy for [`CALM`]) and it is the highest-numbered
///   worker holding connections (one gathers at a time, so that two never fill the same
///   worker at once), all of them to the lowest-numbered worker below it that is not
///   busy and whose running share and its own add up to less than [`Load::GATHER`].
///
/// [`Load::GATHER`] is far below [`Load::SATURATED`], so a gathered worker is not
/// saturated by what it received; and a spread is not undone until the load has been
/// light for [`CALM`]: the two rules do not undo each other's moves while it holds.
pub(crate) fn plan(
    load: &[Option<Load>],
    open: &[usize],
    me: usize,
    calm: bool,
) -> Option<Leaving> {
    let load = load.iter().copied().collect::<Option<Vec<Load>>>()?;
    let n = load.len().min(open.len());
    if me >= n || open[me] == 0 {
        return None;
    }
    let (mine, held) = (load[me], open[me]);
    if mine.busy() {
        let to = (0..n)
            .filter(|&i| i != me)
            .min_by_key(|&i| (load[i].wanted(), open[i], i))?;
        // As many as bring the two halfway to each other, a connection weighing its
        // share of this worker's load: the receiver never ends above the sender.
        let gap = u64::from(mine.wanted().saturating_sub(load[to].wanted()));
        let count = held as u64 * gap / (2 * u64::from(mine.wanted().max(1)));
        return (load[to].wanted() < Load::ROOM && count > 0).then(|| Leaving {
            to,
            count: usize::try_from(count).unwrap_or(held).min(held),
        });
    }
    if !calm || open[me + 1..n].iter().any(|&n| n > 0) {
        return None;
    }
    (0..me)
        .find(|&i| !load[i].busy() && load[i].ran.saturating_add(mine.ran) < Load::GATHER)
        .map(|to| Leaving { to, count: held })
}

/// Turns a worker thread's times into its [`Load`]: the time it ran and the time it
/// waited on a run queue (nanoseconds so far, as `schedstat` counts them) over the
/// wall time between two samples, each window weighing an eighth in a moving average
/// (about the last two seconds count): a burst of a few windows, such as a client
/// opening its connections, does not move connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadMeter {
    times: ThreadTimes,
    at: Instant,
    /// The moving averages of the running and waiting shares, unrounded.
    average: Option<(f64, f64)>,
}

/// A thread's time on a CPU and on a run queue so far, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadTimes {
    pub(crate) ran_ns: u64,
    pub(crate) waited_ns: u64,
}

impl LoadMeter {
    pub(crate) fn new(times: ThreadTimes, at: Instant) -> Self {
        Self {
            times,
            at,
            average: None,
        }
    }

    /// The moving average including the window since the previous sample; `times` are
    /// the thread's at `now`.
    pub(crate) fn sample(&mut self, times: ThreadTimes, now: Instant) -> Load {
        let wall = now.saturating_duration_since(self.at).as_nanos().max(1);
        let share = |now: u64, then: u64| {
            u32::try_from((u128::from(now.saturating_sub(then)) * 1000 / wall).min(1000))
                .unwrap_or(1000)
        };
        let window = Load {
            ran: share(times.ran_ns, self.times.ran_ns),
            waited: share(times.waited_ns, self.times.waited_ns),
        };
        (self.times, self.at) = (times, now);
        let window = (f64::from(window.ran), f64::from(window.waited));
        let step = |average: f64, window: f64| average + (window - average) / 8.0;
        let (ran, waited) = self.average.map_or(window, |(ran, waited)| {
            (step(ran, window.0), step(waited, window.1))
        });
        self.average = Some((ran, waited));
        // within 0..=1000 by construction
        let share = |x: f64| x.round().clamp(0.0, 1000.0) as u32;
        Load {
            ran: share(ran),
            waited: share(waited),
        }
    }
}

/// The calling thread's times so far, from `/proc/thread-self/schedstat`; `None`
/// where the kernel does not give them.
pub(crate) fn thread_times() -> Option<ThreadTimes> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    Some(ThreadTimes {
        ran_ns: fields.next()?.ok()?,
        waited_ns: fields.next()?.ok()?,
    })
}

/// Worker `me`'s load watch: every [`WINDOW`] it measures the thread's load, publishes
/// it, and plans its moves. Ends at once where the loads cannot be measured (they stay
/// unknown, and the balance places by count).
///
/// A thread whose running time did not grow over a window (the watch itself ran on
/// it) is on a kernel that does not count: its load becomes unknown again.
pub(crate) async fn watch_load(balance: Arc<AcceptBalance>, me: usize) {
    let Some(mut last) = thread_times() else {
        return;
    };
    let mut meter = LoadMeter::new(last, Instant::now());
    let mut ticks = tokio::time::interval(WINDOW);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut settled_at = Instant::now();
    loop {
        ticks.tick().await;
        let times = thread_times().filter(|times| times.ran_ns > last.ran_ns);
        let Some(times) = times else {
            balance.stop(me);
            return;
        };
        last = times;
        let now = Instant::now();
        let load = meter.sample(times, now);
        balance.set_load(me, load, now);
        if now < settled_at {
            continue;
        }
        let leaving = balance.replan(me, now);
        if leaving.is_some() {
            settled_at = now + SETTLE;
        }
        tracing::trace!(
            worker = me,
            ran = load.ran,
            waited = load.waited,
            ?leaving,
            "worker load"
        );
    }
}

impl AcceptBalance {
    /// The balance of `workers` workers and one share per worker, in index order.
    pub(crate) fn shares(workers: usize) -> Vec<WorkerShare> {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..workers).map(|_| mpsc::unbounded_channel()).unzip();
        let balance = Arc::new(Self {
            open: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            load: (0..workers).map(|_| AtomicU32::new(UNKNOWN)).collect(),
            busy_at: AtomicU64::new(0),
            started: Instant::now(),
            leaving: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            inboxes: senders.into_boxed_slice(),
        });
        receivers
            .into_iter()
            .enumerate()
            .map(|(me, inbox)| WorkerShare {
                balance: Arc::clone(&balance),
                me,
                inbox,
            })
            .collect()
    }

    /// Picks the worker for a connection `me` accepted and counts it open there.
    /// `movable`: whether the connection may move later (not TLS).
    pub(crate) fn assign(self: &Arc<Self>, me: usize, movable: bool) -> (usize, OpenConnection) {
        let worker = place(&self.loads(), &self.open_counts(), me, movable);
        (worker, self.open_on(worker))
    }

    /// Counts a connection open on `worker` without choosing (one that `worker` serves
    /// itself after all).
    pub(crate) fn open_on(self: &Arc<Self>, worker: usize) -> OpenConnection {
        self.open[worker].fetch_add(1, Ordering::Relaxed);
        OpenConnection {
            balance: Arc::clone(self),
            worker,
            moved: false,
        }
    }

    /// Worker `me` stopped measuring (shutdown, or a kernel that does not count): its
    /// load is unknown again and its planned moves are dropped.
    pub(crate) fn stop(&self, me: usize) {
        self.load[me].store(UNKNOWN, Ordering::Relaxed);
        self.leaving[me].store(0, Ordering::Relaxed);
    }

    /// Hands `connection` to `worker`; gives it back when that worker has stopped.
    pub(crate) fn hand_over(&self, worker: usize, connection: Handed) -> Result<(), Handed> {
        self.inboxes[worker].send(connection).map_err(|e| e.0)
    }

    /// The worker threads' open connections and loads, in the Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str("# HELP keypool_worker_connections Open client connections on each worker thread.\n# TYPE keypool_worker_connections gauge\n");
        for (worker, n) in self.open_counts().iter().enumerate() {
            let _ = writeln!(out, "keypool_worker_connections{{worker=\"{worker}\"}} {n}");
        }
        out.push_str("# HELP keypool_worker_load_ratio Share of the last seconds each worker thread ran on a CPU (ran) and waited on a run queue for one (waited); absent where the kernel does not tell.\n# TYPE keypool_worker_load_ratio gauge\n");
        for (worker, load) in self.loads().iter().enumerate() {
            if let Some(load) = load {
                for (kind, share) in [("ran", load.ran), ("waited", load.waited)] {
                    let _ = writeln!(
                        out,
                        "keypool_worker_load_ratio{{worker=\"{worker}\",kind=\"{kind}\"}} {}",
                        f64::from(share) / 1000.0
                    );
                }
            }
        }
    }

    /// Open connections per worker.
    pub(crate) fn open_counts(&self) -> Vec<usize> {
        self.open
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Each worker's last published load (`None` when not measured).
    fn loads(&self) -> Vec<Option<Load>> {
        self.load
            .iter()
            .map(|l| Load::unpack(l.load(Ordering::Relaxed)))
            .collect()
    }

    /// Publishes worker `me`'s load, measured at `now`.
    pub(crate) fn set_load(&self, me: usize, load: Load, now: Instant) {
        self.load[me].store(load.pack(), Ordering::Relaxed);
        if load.busy() {
            // + 1: 0 stands for never
            let at = self.since_start(now).saturating_add(1);
            self.busy_at.fetch_max(at, Ordering::Relaxed);
        }
    }

    fn since_start(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether no worker has been busy for [`CALM`] at `now` (nor ever, since the
    /// start, within [`CALM`] of it: a start is calm).
    fn calm(&self, now: Instant) -> bool {
        let busy_at = self.busy_at.load(Ordering::Relaxed);
        let now = self.since_start(now).saturating_add(1);
        busy_at == 0
            || now.saturating_sub(busy_at) >= u64::try_from(CALM.as_millis()).unwrap_or(u64::MAX)
    }

    /// Plans worker `me`'s moves from the loads now published ([`plan`]); a plan
    /// replaces the previous one, whatever of it is still undone.
    pub(crate) fn replan(&self, me: usize, now: Instant) -> Option<Leaving> {
        let leaving = plan(&self.loads(), &self.open_counts(), me, self.calm(now));
        self.leaving[me].store(leaving.map_or(0, Leaving::pack), Ordering::Relaxed);
        leaving
    }

    /// Plans `count` moves from worker `from` to `to` outright (tests).
    #[cfg(test)]
    pub(crate) fn order(&self, from: usize, leaving: Leaving) {
        self.leaving[from].store(leaving.pack(), Ordering::Relaxed);
    }

    /// Whether a connection of worker `me`, idle between two requests, should move, and
    /// where: takes one of the moves planned for `me`. One relaxed load when none is.
    pub(crate) fn take_move(&self, me: usize) -> Option<usize> {
        let slot = self.leaving.get(me)?;
        let mut word = slot.load(Ordering::Relaxed);
        loop {
            let leaving = Leaving::unpack(word);
            if leaving.count == 0 || leaving.to == me || leaving.to >= self.open.len() {
                return None;
            }
            let rest = Leaving {
                count: leaving.count - 1,
                ..leaving
            };
            match slot.compare_exchange_weak(
                word,
                rest.pack(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(leaving.to),
                Err(now) => word = now,
            }
        }
    }

    /// Moves a connection of worker `from` (counted open there by `open`) to worker
    /// `to`: counted open there, and sent through its inbox. The connection is given
    /// back (still counted on `from`) when `to` has stopped.
    pub(crate) fn move_to(
        self: &Arc<Self>,
        to: usize,
        stream: std::net::TcpStream,
        peer: SocketAddr,
        open: OpenConnection,
    ) -> Result<(), Handed> {
        let mut there = self.open_on(to);
        there.moved = true;
        match self.hand_over(to, (stream, peer, there)) {
            Ok(()) => {
                drop(open);
                Ok(())
            }
            Err((stream, peer, there)) => {
                drop(there);
                Err((stream, peer, open))
            }
        }
    }
}

impl OpenConnection {
    /// Whether the connection came from another worker between two requests.
    pub(crate) fn moved(&self) -> bool {
        self.moved
    }

    /// Whether this connection, idle between two requests, should move to another
    /// worker, and to which ([`AcceptBalance::take_move`]).
    pub(crate) fn take_move(&self) -> Option<usize> {
        self.balance.take_move(self.worker)
    }

    /// Moves the connection to worker `to` ([`AcceptBalance::move_to`]).
    pub(crate) fn move_to(
        self,
        to: usize,
        stream: std::net::TcpStream,
        peer: SocketAddr,
    ) -> Result<(), Handed> {
        let balance = Arc::clone(&self.balance);
        balance.move_to(to, stream, peer, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_goes_to_the_worker_with_the_fewest() {
        assert_eq!(least_loaded(&[0, 0], 0), 0);
        assert_eq!(least_loaded(&[0, 0], 1), 1);
        assert_eq!(least_loaded(&[3, 2], 0), 1);
        assert_eq!(least_loaded(&[2, 3], 1), 0);
        assert_eq!(least_loaded(&[5, 1, 1, 4], 3), 1);
        assert_eq!(least_loaded(&[5, 1, 1, 4], 2), 2);
        assert_eq!(least_loaded(&[7], 0), 0);
    }

    #[test]
    fn while_the_loads_are_unknown_a_burst_of_accepts_is_spread_evenly() {
        let shares = AcceptBalance::shares(2);
        let balance = Arc::clone(&shares[0].balance);
        // Worker 0 accepts all 64, as it does when the other thread is still asleep.
        let guards: Vec<OpenConnection> = (0..64).map(|_| balance.assign(0, true).1).collect();
        assert_eq!(balance.open_counts(), [32, 32]);
        drop(guards);
        assert_eq!(balance.open_counts(), [0, 0]);
        let (worker, _kept) = balance.assign(1, true);
        assert_eq!((worker, balance.open_counts()), (1, vec![0, 1]));
        let _served_here = balance.open_on(1);
        assert_eq!(balance.assign(1, true).0, 0);
    }

    #[test]
    fn a_stopped_worker_gives_the_connection_back() {
        let mut shares = AcceptBalance::shares(2);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        let balance = Arc::clone(&shares[0].balance);
        let (worker, open) = balance.assign(0, true);
        assert_eq!(worker, 0);
        let _kept = open;
        let (worker, open) = balance.assign(0, true);
        assert_eq!(worker, 1);
        balance.hand_over(1, (stream, peer, open)).unwrap();
        let (got, got_peer, open) = shares[1].inbox.try_recv().unwrap();
        assert_eq!(got_peer, peer);
        assert_eq!(balance.open_counts(), [1, 1]);
        drop(shares.pop());
        let (_, _, open) = balance.hand_over(1, (got, got_peer, open)).unwrap_err();
        drop(open);
        assert_eq!(balance.open_counts(), [1, 0]);
        drop(client);
    }

    const IDLE: Load = Load { ran: 0, waited: 0 };
    /// One worker serving 16 busy connections on two shared vCPUs (measured).
    const PACKED: Load = Load {
        ran: 900,
        waited: 90,
    };
    const SATURATED: Load = Load {
        ran: 1000,
        waited: 0,
    };
    /// One worker beside two busy loops (measured).
    const STARVED: Load = Load {
        ran: 400,
        waited: 440,
    };

    fn place_movable(load: &[Option<Load>], open: &[usize], me: usize) -> usize {
        place(load, open, me, true)
    }

    fn known(loads: &[Load]) -> Vec<Option<Load>> {
        loads.iter().copied().map(Some).collect()
    }

    #[test]
    fn busy_means_saturated_or_starved() {
        let busy = |ran, waited| Load { ran, waited }.busy();
        assert!(!IDLE.busy());
        assert!(!PACKED.busy(), "a worker that runs 90 % of the time");
        assert!(SATURATED.busy());
        assert!(STARVED.busy());
        assert!(
            !busy(50, 400),
            "a light load on a busy machine wants little"
        );
        assert!(busy(990, 0));
        assert!(!busy(989, 0));
        assert!(busy(400, 400));
        assert!(!busy(400, 399), "waits less than it runs");
        assert!(busy(350, 350));
        assert!(!busy(349, 350), "wants a CPU less than 70 % of the time");
        assert!(!busy(200, 299));
        // the two workers of a spread pair waiting on each other (measured)
        assert!(!busy(450, 370));
        assert!(!busy(400, 350));
    }

    #[test]
    fn a_new_connection_goes_to_the_lowest_worker_that_is_not_busy() {
        assert_eq!(place_movable(&known(&[IDLE, IDLE]), &[0, 0], 1), 0);
        assert_eq!(place_movable(&known(&[PACKED, IDLE]), &[16, 0], 1), 0);
        assert_eq!(place_movable(&known(&[SATURATED, IDLE]), &[16, 0], 0), 1);
        assert_eq!(
            place_movable(&known(&[STARVED, PACKED, IDLE]), &[9, 9, 0], 0),
            1
        );
        // all busy: the one that wanted the least, then the fewest connections
        assert_eq!(place_movable(&known(&[SATURATED, STARVED]), &[5, 9], 0), 1);
        assert_eq!(place_movable(&known(&[STARVED, STARVED]), &[5, 3], 0), 1);
        // any load unknown: by count, as the accepting worker on a tie
        assert_eq!(place_movable(&[Some(IDLE), None], &[4, 1], 0), 1);
        assert_eq!(place_movable(&[None, None], &[1, 1], 1), 1);
        // a connection that can never move (TLS): by count too
        assert_eq!(place(&known(&[IDLE, IDLE]), &[4, 1], 0, false), 1);
        assert_eq!(place(&known(&[IDLE, IDLE]), &[1, 1], 1, false), 1);
    }

    #[test]
    fn with_the_loads_known_a_burst_of_accepts_is_packed() {
        let shares = AcceptBalance::shares(2);
        let balance = Arc::clone(&shares[0].balance);
        let now = Instant::now();
        balance.set_load(0, IDLE, now);
        balance.set_load(1, IDLE, now);
        let guards: Vec<OpenConnection> = (0..64).map(|i| balance.assign(i % 2, true).1).collect();
        assert_eq!(balance.open_counts(), [64, 0]);
        balance.set_load(0, SATURATED, now);
        assert_eq!(balance.assign(0, true).0, 1);
        drop(guards);
    }

    #[test]
    fn a_busy_worker_sends_half_of_its_connections_to_one_with_room() {
        let plan = |loads: &[Load], open: &[usize], me| plan(&known(loads), open, me, true);
        assert_eq!(
            plan(&[SATURATED, IDLE], &[16, 0], 0),
            Some(Leaving { to: 1, count: 8 })
        );
        // halfway: 840 → 300 over 9 connections moves 2 (a connection weighs ~93)
        let light = Load {
            ran: 250,
            waited: 50,
        };
        assert_eq!(
            plan(&[STARVED, light, PACKED], &[9, 2, 16], 0),
            Some(Leaving { to: 1, count: 2 })
        );
        // one connection that is the whole load stays: it would only swap places
        assert_eq!(plan(&[SATURATED, IDLE], &[1, 0], 0), None);
        // two connections that are the whole load: one moves
        assert_eq!(
            plan(&[SATURATED, IDLE], &[2, 0], 0),
            Some(Leaving { to: 1, count: 1 })
        );
        // no worker with room: nothing moves
        assert_eq!(plan(&[SATURATED, PACKED], &[16, 16], 0), None);
        assert_eq!(plan(&[STARVED, STARVED], &[32, 32], 1), None);
        // nothing to send
        assert_eq!(plan(&[SATURATED, IDLE], &[0, 0], 0), None);
        // a single worker has nowhere to send
        assert_eq!(plan(&[SATURATED], &[16], 0), None);
    }

    #[test]
    fn a_light_worker_is_gathered_into_a_lower_one_only_when_calm() {
        let light = Load {
            ran: 200,
            waited: 20,
        };
        let loads = known(&[light, light]);
        assert_eq!(
            plan(&loads, &[3, 5], 1, true),
            Some(Leaving { to: 0, count: 5 })
        );
        assert_eq!(plan(&loads, &[3, 5], 1, false), None, "not calm");
        assert_eq!(plan(&loads, &[3, 5], 0, true), None, "never upwards");
        // together they would run too much
        let half = Load {
            ran: 250,
            waited: 20,
        };
        assert_eq!(plan(&known(&[half, half]), &[8, 8], 1, true), None);
        // a busy worker does not receive
        assert_eq!(
            plan(&known(&[STARVED, light, IDLE]), &[9, 2, 4], 2, true),
            Some(Leaving { to: 1, count: 4 })
        );
        // one gathers at a time: the highest-numbered worker holding connections
        let three = known(&[light, light, IDLE]);
        assert_eq!(plan(&three, &[1, 4, 2], 1, true), None);
        assert_eq!(
            plan(&three, &[1, 4, 2], 2, true),
            Some(Leaving { to: 0, count: 2 })
        );
        assert_eq!(
            plan(&three, &[1, 4, 0], 1, true),
            Some(Leaving { to: 0, count: 4 })
        );
        // unknown loads: nothing moves
        assert_eq!(plan(&[None, Some(light)], &[3, 5], 1, true), None);
    }

    #[test]
    fn the_meter_averages_the_share_of_each_window() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let times = |ran_ms: u64, waited_ms: u64| ThreadTimes {
            ran_ns: ran_ms * 1_000_000,
            waited_ns: waited_ms * 1_000_000,
        };
        let share = |ran, waited| Load { ran, waited };
        let mut meter = LoadMeter::new(times(0, 0), at(0));
        assert_eq!(meter.sample(times(80, 10), at(100)), share(800, 100));
        // a window of 100 % weighs an eighth
        assert_eq!(meter.sample(times(180, 10), at(200)), share(825, 88));
        // shares are of the wall time between samples, capped at all of it
        let mut meter = LoadMeter::new(times(0, 0), at(0));
        assert_eq!(meter.sample(times(300, 0), at(200)), share(1000, 0));
        // a constant load is reached and held
        let mut meter = LoadMeter::new(times(0, 0), at(0));
        let mut load = IDLE;
        for w in 1..=100 {
            load = meter.sample(times(w * 50, w * 30), at(w * 100));
        }
        assert_eq!(load, share(500, 300));
        // and a falling one to its own value, not above it (a rounded-up average would
        // stop short, and read 992 for a true 985)
        let mut meter = LoadMeter::new(times(0, 0), at(0));
        let ran = |ms: u64, share: u64| ThreadTimes {
            ran_ns: ms * share * 1_000,
            waited_ns: 0,
        };
        for w in 1..=10 {
            meter.sample(ran(w * 100, 1000), at(w * 100));
        }
        for w in 11..=200 {
            let so_far = ran(1000, 1000).ran_ns + ran((w - 10) * 100, 985).ran_ns;
            load = meter.sample(
                ThreadTimes {
                    ran_ns: so_far,
                    waited_ns: 0,
                },
                at(w * 100),
            );
        }
        assert_eq!(
            load,
            Load {
                ran: 985,
                waited: 0
            }
        );
        assert!(!load.busy());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_thread_times_come_from_this_threads_schedstat() {
        let before = thread_times().expect("Linux gives /proc/thread-self/schedstat");
        let mut after = before;
        let mut spin = 0u64;
        // run until the kernel has counted some of this thread's time (bounded)
        for _ in 0..1_000 {
            for i in 0..100_000u64 {
                spin = std::hint::black_box(spin.wrapping_add(i));
            }
            after = thread_times().unwrap();
            if after.ran_ns > before.ran_ns {
                break;
            }
        }
        assert!(after.ran_ns > before.ran_ns, "{before:?} {after:?}");
        assert!(after.waited_ns >= before.waited_ns);
    }

    #[test]
    fn the_workers_connections_and_loads_are_gauges() {
        let shares = AcceptBalance::shares(2);
        let balance = &shares[0].balance;
        let _open = [balance.open_on(1), balance.open_on(1)];
        balance.set_load(
            1,
            Load {
                ran: 250,
                waited: 40,
            },
            Instant::now(),
        );
        let mut out = String::new();
        balance.render(&mut out);
        assert!(
            out.contains("keypool_worker_connections{worker=\"0\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("keypool_worker_connections{worker=\"1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("keypool_worker_load_ratio{worker=\"1\",kind=\"ran\"} 0.25\n"),
            "{out}"
        );
        assert!(
            out.contains("keypool_worker_load_ratio{worker=\"1\",kind=\"waited\"} 0.04\n"),
            "{out}"
        );
        assert!(
            !out.contains("keypool_worker_load_ratio{worker=\"0\""),
            "unknown: {out}"
        );
    }

    #[test]
    fn a_planned_move_is_taken_once_per_connection() {
        let shares = AcceptBalance::shares(3);
        let balance = &shares[0].balance;
        assert_eq!(balance.take_move(0), None);
        balance.order(0, Leaving { to: 2, count: 2 });
        assert_eq!(balance.take_move(0), Some(2));
        assert_eq!(balance.take_move(0), Some(2));
        assert_eq!(balance.take_move(0), None);
        assert_eq!(balance.take_move(1), None);
        // a plan replaces the previous one
        balance.order(1, Leaving { to: 0, count: 5 });
        let now = Instant::now();
        for w in 0..3 {
            balance.set_load(w, IDLE, now);
        }
        assert_eq!(balance.replan(1, now), None);
        assert_eq!(balance.take_move(1), None);
    }

    #[test]
    fn moving_counts_the_connection_on_its_new_worker() {
        let mut shares = AcceptBalance::shares(2);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        let balance = Arc::clone(&shares[0].balance);
        let open = balance.open_on(0);
        open.move_to(1, stream, peer).unwrap();
        assert_eq!(balance.open_counts(), [0, 1]);
        let (stream, _, open) = shares[1].inbox.try_recv().unwrap();
        // back to 0, which has stopped: given back, still counted on 1
        drop(shares.remove(0));
        let (_, _, open) = open.move_to(0, stream, peer).unwrap_err();
        assert_eq!(balance.open_counts(), [0, 1]);
        drop(open);
        assert_eq!(balance.open_counts(), [0, 0]);
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        fn load() -> impl Strategy<Value = Load> {
            (0u32..=1000, 0u32..=1000).prop_map(|(ran, waited)| Load {
                ran,
                waited: waited.min(1000 - ran),
            })
        }

        fn workers() -> impl Strategy<Value = (Vec<Load>, Vec<usize>)> {
            (1usize..6).prop_flat_map(|n| {
                (
                    proptest::collection::vec(load(), n),
                    proptest::collection::vec(0usize..100, n),
                )
            })
        }

        proptest! {
            /// A plan never sends to the worker itself or to one that does not exist,
            /// never more than it holds; a spread comes from a busy worker to one with
            /// room, a gather from a calm, unbusy one into a lower one.
            #[test]
            fn a_plan_is_a_move_the_rules_allow(
                (loads, open) in workers(),
                me in 0usize..6,
                calm in any::<bool>(),
            ) {
                let known: Vec<Option<Load>> = loads.iter().copied().map(Some).collect();
                let Some(leaving) = plan(&known, &open, me, calm) else {
                    return Ok(());
                };
                prop_assert!(me < loads.len());
                prop_assert!(leaving.to < loads.len() && leaving.to != me);
                prop_assert!(leaving.count >= 1 && leaving.count <= open[me]);
                if loads[me].busy() {
                    let (mine, theirs) = (loads[me].wanted(), loads[leaving.to].wanted());
                    prop_assert!(theirs < Load::ROOM);
                    // the receiver, a connection weighing mine / open, ends at most halfway
                    let weight = f64::from(mine) / open[me] as f64;
                    let moved = weight * leaving.count as f64;
                    prop_assert!(f64::from(theirs) + moved <= f64::from(mine) - moved + 1e-6);
                    prop_assert!(leaving.count < open[me]);
                } else {
                    prop_assert!(calm && leaving.to < me);
                    prop_assert_eq!(leaving.count, open[me]);
                    prop_assert!(!loads[leaving.to].busy());
                    prop_assert!(loads[leaving.to].ran + loads[me].ran < Load::GATHER);
                }
            }

            /// A new connection goes to a worker that exists, and to a busy one only
            /// when every worker is busy.
            #[test]
            fn a_placement_prefers_a_worker_that_is_not_busy(
                (loads, open) in workers(),
                me in 0usize..6,
            ) {
                let me = me % loads.len();
                let known: Vec<Option<Load>> = loads.iter().copied().map(Some).collect();
                let to = place(&known, &open, me, true);
                prop_assert!(to < loads.len());
                if loads[to].busy() {
                    prop_assert!(loads.iter().all(|l| l.busy()));
                } else {
                    prop_assert!(loads[..to].iter().all(|l| l.busy()));
                }
            }

            /// A model of the loop: connections of equal demand, each worker's running
            /// share that demand times its connections (capped at all of the time, on
            /// a machine of its own: no waits), every worker planning every window and
            /// its moves done at once, calm as the balance keeps it. Whatever the
            /// demand and the start, the moves stop, and then no worker is saturated
            /// while another could take half of its connections.
            #[test]
            fn the_moves_stop_while_the_load_holds(
                workers in 1usize..5,
                connections in 1usize..80,
                per_connection in 1u32..200,
                start in proptest::collection::vec(0usize..5, 80),
            ) {
                let mut open = vec![0usize; workers];
                for &w in start.iter().take(connections) {
                    open[w % workers] += 1;
                }
                let loads = |open: &[usize]| -> Vec<Option<Load>> {
                    open.iter()
                        .map(|&n| {
                            let ran = (n as u64 * u64::from(per_connection)).min(1000) as u32;
                            Some(Load { ran, waited: 0 })
                        })
                        .collect()
                };
                let calm_windows = (CALM.as_millis() / WINDOW.as_millis()) as usize;
                let mut since_busy = usize::MAX;
                let mut moved_in_window = Vec::new();
                for _ in 0..400 {
                    let now = loads(&open);
                    since_busy = if now.iter().flatten().any(|l| l.busy()) {
                        0
                    } else {
                        since_busy.saturating_add(1)
                    };
                    let calm = since_busy >= calm_windows;
                    let mut moved = 0;
                    for me in 0..workers {
                        if let Some(leaving) = plan(&loads(&open), &open, me, calm) {
                            open[me] -= leaving.count;
                            open[leaving.to] += leaving.count;
                            moved += leaving.count;
                        }
                    }
                    moved_in_window.push(moved);
                }
                prop_assert_eq!(open.iter().sum::<usize>(), connections);
                prop_assert!(
                    moved_in_window[200..].iter().all(|&m| m == 0),
                    "still moving after 200 windows: {:?}", &moved_in_window[..40]
                );
                // the moves never made the busiest worker busier, but for a gather,
                // which stays below GATHER
                let busiest = |open: &[usize]| {
                    loads(open).iter().flatten().map(|l| l.ran).max().unwrap_or(0)
                };
                let mut first = vec![0usize; workers];
                for &w in start.iter().take(connections) {
                    first[w % workers] += 1;
                }
                prop_assert!(
                    busiest(&open) <= busiest(&first).max(Load::GATHER),
                    "{first:?} → {open:?}"
                );
            }
        }
    }
}
