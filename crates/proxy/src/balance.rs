//! Spreading accepted connections evenly over the worker threads of
//! [`crate::run_workers`].
//!
//! Every worker accepts from the same listening socket, and the kernel hands a new
//! connection to whichever thread asks first. When many connections arrive at once (a
//! client opening its pool), the thread that wakes first accepts nearly all of them
//! before the other has even been scheduled (waking an idle CPU takes tens of
//! microseconds in a VM, an `accept` a few): one thread then serves most connections
//! while the other idles, and when that thread loses its CPU to another process every
//! one of its connections waits. So the worker that accepts a connection gives it to
//! the worker with the fewest open ones (itself on a tie) through that worker's inbox:
//! one cross-thread hand-over per connection, none per request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// A connection handed from the worker that accepted it to the one that serves it,
/// already counted open there.
pub(crate) type Handed = (std::net::TcpStream, SocketAddr, OpenConnection);

/// The open public connections of each worker, and each worker's inbox.
#[derive(Debug)]
pub(crate) struct AcceptBalance {
    open: Box<[AtomicUsize]>,
    inboxes: Box<[mpsc::UnboundedSender<Handed>]>,
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

impl AcceptBalance {
    /// The balance of `workers` workers and one share per worker, in index order.
    pub(crate) fn shares(workers: usize) -> Vec<WorkerShare> {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..workers).map(|_| mpsc::unbounded_channel()).unzip();
        let balance = Arc::new(Self {
            open: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
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
    pub(crate) fn assign(self: &Arc<Self>, me: usize) -> (usize, OpenConnection) {
        let open: Vec<usize> = self
            .open
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        let worker = least_loaded(&open, me);
        self.open[worker].fetch_add(1, Ordering::Relaxed);
        (
            worker,
            OpenConnection {
                balance: Arc::clone(self),
                worker,
            },
        )
    }

    /// Counts a connection open on `worker` without choosing (one that `worker` serves
    /// itself after all).
    pub(crate) fn open_on(self: &Arc<Self>, worker: usize) -> OpenConnection {
        self.open[worker].fetch_add(1, Ordering::Relaxed);
        OpenConnection {
            balance: Arc::clone(self),
            worker,
        }
    }

    /// Hands `connection` to `worker`; gives it back when that worker has stopped.
    pub(crate) fn hand_over(&self, worker: usize, connection: Handed) -> Result<(), Handed> {
        self.inboxes[worker].send(connection).map_err(|e| e.0)
    }

    /// Open connections per worker.
    #[cfg(test)]
    pub(crate) fn open(&self) -> Vec<usize> {
        self.open
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
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
    fn a_burst_of_accepts_on_one_worker_is_spread_evenly() {
        let shares = AcceptBalance::shares(2);
        let balance = Arc::clone(&shares[0].balance);
        // Worker 0 accepts all 64, as it does when the other thread is still asleep.
        let guards: Vec<OpenConnection> = (0..64).map(|_| balance.assign(0).1).collect();
        assert_eq!(balance.open(), [32, 32]);
        drop(guards);
        assert_eq!(balance.open(), [0, 0]);
        let (worker, _kept) = balance.assign(1);
        assert_eq!((worker, balance.open()), (1, vec![0, 1]));
        let _served_here = balance.open_on(1);
        assert_eq!(balance.assign(1).0, 0);
    }

    #[test]
    fn a_stopped_worker_gives_the_connection_back() {
        let mut shares = AcceptBalance::shares(2);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        let balance = Arc::clone(&shares[0].balance);
        let (worker, open) = balance.assign(0);
        assert_eq!(worker, 0);
        let _kept = open;
        let (worker, open) = balance.assign(0);
        assert_eq!(worker, 1);
        balance.hand_over(1, (stream, peer, open)).unwrap();
        let (got, got_peer, open) = shares[1].inbox.try_recv().unwrap();
        assert_eq!(got_peer, peer);
        assert_eq!(balance.open(), [1, 1]);
        drop(shares.pop());
        let (_, _, open) = balance.hand_over(1, (got, got_peer, open)).unwrap_err();
        drop(open);
        assert_eq!(balance.open(), [1, 0]);
        drop(client);
    }
}
