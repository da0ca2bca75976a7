//! Admission: connections that have not proved anything yet live in a small pool of their own.
//!
//! A connection enters the pool when it is accepted and leaves it when it is done proving itself
//! (for `exec-server`: a successful `initialize`; for the rendezvous: an authorised request). The
//! pool never refuses a newcomer; when it is full it closes an older entry instead:
//! - a source (an IP address; an IPv6 /64; every local peer together) at
//!   `per_source` entries loses its own oldest, so one host flooding the pool churns its own
//!   slots;
//! - otherwise, a full pool loses its oldest entry.
//!
//! In both cases an entry that has not authenticated (no bearer token checked yet) goes before
//! one that has, so a flood of silent sockets cannot push out a token holder that is still
//! initializing. A client that speaks at once is in the pool for a millisecond or two; only a
//! flood opening more than the pool holds within that time can displace it.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Where a connection comes from, for per-source limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address, or an IPv6 /64 (a host controls a whole /64).
    Ip(IpAddr),
    /// A unix socket peer (all local).
    Local,
}

impl Source {
    /// The source of a TCP peer.
    pub fn of(peer: SocketAddr) -> Self {
        match peer.ip() {
            IpAddr::V4(v4) => Source::Ip(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::Ip(IpAddr::V4(v4)),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    Source::Ip(IpAddr::V6(bits.into()))
                }
            },
        }
    }
}

struct Entry {
    source: Source,
    authenticated: bool,
    evict: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct Pool {
    next_id: u64,
    /// Oldest first (ids only grow).
    entries: BTreeMap<u64, Entry>,
    evicted: u64,
}

/// The pool of pending connections.
pub struct Admission {
    pool: Mutex<Pool>,
    capacity: usize,
    per_source: usize,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("capacity", &self.capacity)
            .field("per_source", &self.per_source)
            .field("pending", &self.pending())
            .finish()
    }
}

impl Admission {
    /// A pool of `capacity` entries, at most `per_source` of them from one source.
    pub fn new(capacity: usize, per_source: usize) -> Arc<Self> {
        Arc::new(Self {
            pool: Mutex::new(Pool::default()),
            capacity: capacity.max(1),
            per_source: per_source.clamp(1, capacity.max(1)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit a connection from `source`, closing an older pending one if the pool (or the
    /// source's share of it) is full.
    pub fn admit(self: &Arc<Self>, source: Source) -> PendingTicket {
        let (sender, receiver) = oneshot::channel();
        let mut pool = self.lock();
        let from_source = pool
            .entries
            .values()
            .filter(|entry| entry.source == source)
            .count();
        let victim = if from_source >= self.per_source {
            oldest(&pool, |entry| entry.source == source)
        } else if pool.entries.len() >= self.capacity {
            oldest(&pool, |_| true)
        } else {
            None
        };
        if let Some(victim) = victim
            && let Some(mut entry) = pool.entries.remove(&victim)
        {
            pool.evicted += 1;
            if let Some(evict) = entry.evict.take() {
                let _ = evict.send(());
            }
        }
        let id = pool.next_id;
        pool.next_id += 1;
        pool.entries.insert(
            id,
            Entry {
                source,
                authenticated: false,
                evict: Some(sender),
            },
        );
        PendingTicket {
            admission: self.clone(),
            id,
            evicted: receiver,
        }
    }

    /// Connections pending now.
    pub fn pending(&self) -> usize {
        self.lock().entries.len()
    }

    /// Pending connections closed so far to make room.
    pub fn evicted(&self) -> u64 {
        self.lock().evicted
    }
}

/// The oldest entry `matching`, one that has not authenticated first.
fn oldest(pool: &Pool, matching: impl Fn(&Entry) -> bool) -> Option<u64> {
    let candidates = || pool.entries.iter().filter(|(_, entry)| matching(entry));
    candidates()
        .find(|(_, entry)| !entry.authenticated)
        .or_else(|| candidates().next())
        .map(|(id, _)| *id)
}

/// A connection's place in the pool; dropping it leaves the pool.
pub struct PendingTicket {
    admission: Arc<Admission>,
    id: u64,
    evicted: oneshot::Receiver<()>,
}

impl std::fmt::Debug for PendingTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingTicket")
            .field("id", &self.id)
            .finish()
    }
}

impl PendingTicket {
    /// The connection presented a valid credential: evict others before it.
    pub fn authenticated(&self) {
        if let Some(entry) = self.admission.lock().entries.get_mut(&self.id) {
            entry.authenticated = true;
        }
    }

    /// Resolves when the pool closed this connection to make room.
    pub async fn evicted(&mut self) {
        // A dropped sender means the entry was removed, which only eviction does.
        let _ = (&mut self.evicted).await;
    }
}

/// Resolves when the pending slot was taken away; never when there is none (the connection
/// has left the pool): for a `select!` beside the connection's own work.
pub async fn evicted(pending: &mut Option<PendingTicket>) {
    match pending {
        Some(ticket) => ticket.evicted().await,
        None => std::future::pending().await,
    }
}

impl Drop for PendingTicket {
    fn drop(&mut self) {
        self.admission.lock().entries.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    fn ip(text: &str) -> Source {
        Source::of(SocketAddr::new(text.parse().unwrap(), 1))
    }

    fn is_evicted(ticket: &mut PendingTicket) -> bool {
        ticket.evicted().now_or_never().is_some()
    }

    #[test]
    fn a_full_pool_closes_its_oldest_entry_and_admits_the_newcomer() {
        let admission = Admission::new(3, 3);
        let mut tickets: Vec<_> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|a| admission.admit(ip(a)))
            .collect();
        let mut newcomer = admission.admit(ip("10.0.0.4"));
        assert!(is_evicted(&mut tickets[0]));
        assert!(!is_evicted(&mut tickets[1]) && !is_evicted(&mut newcomer));
        assert_eq!((admission.pending(), admission.evicted()), (3, 1));
    }

    #[test]
    fn a_flooding_source_only_churns_its_own_entries() {
        let admission = Admission::new(10, 2);
        let mut other = admission.admit(ip("192.0.2.7"));
        let mut flood: Vec<_> = (0..20).map(|_| admission.admit(ip("127.0.0.1"))).collect();
        assert!(!is_evicted(&mut other), "another source keeps its place");
        let alive = flood
            .iter_mut()
            .map(is_evicted)
            .filter(|gone| !gone)
            .count();
        assert_eq!(alive, 2);
        assert_eq!(admission.pending(), 3);
    }

    #[test]
    fn unauthenticated_entries_are_closed_before_authenticated_ones() {
        let admission = Admission::new(2, 2);
        let mut token_holder = admission.admit(ip("10.0.0.1"));
        token_holder.authenticated();
        let mut silent = admission.admit(ip("10.0.0.2"));
        let _newcomer = admission.admit(ip("10.0.0.3"));
        assert!(is_evicted(&mut silent));
        assert!(!is_evicted(&mut token_holder));
    }

    #[test]
    fn a_dropped_ticket_leaves_the_pool() {
        let admission = Admission::new(2, 2);
        let ticket = admission.admit(Source::Local);
        assert_eq!(admission.pending(), 1);
        drop(ticket);
        assert_eq!(admission.pending(), 0);
    }

    #[test]
    fn ipv6_hosts_are_grouped_by_their_64_and_mapped_v4_is_v4() {
        assert_eq!(ip("2001:db8::1"), ip("2001:db8::ffff:1"));
        assert_ne!(ip("2001:db8::1"), ip("2001:db8:0:1::1"));
        assert_eq!(ip("::ffff:10.1.2.3"), ip("10.1.2.3"));
    }
}
