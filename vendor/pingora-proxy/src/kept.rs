// Animal Store's patch (see `vendor/README.md` in its repository): this module.

//! Idle HTTP/1 upstream connections kept by the thread that last used them, for its next
//! request to the same peer, in place of pingora's connection pool
//! ([`crate::HttpProxy::kept_upstreams`]; off unless set).
//!
//! The pool serves every thread. A connection released to it is wrapped in an `Arc<Mutex>` and
//! put in a shared LRU under a lock, and a task is spawned to watch it while it is idle (for the
//! peer's close, and for its idle timeout). Taking it back signals that task, waits for the lock
//! it held, and asks the kernel for the socket's peer address (`getpeername`). A bare proxy
//! with this module instead of the pool made 6,578 fewer instructions a GET (54,158 against
//! 60,736, callgrind) and took 2.5 µs less CPU time (19.8 against 22.3 µs): about a tenth of a
//! proxied GET (`bench/results.md` in Animal Store's repository). With a runtime per thread (no
//! work stealing), a connection is released and taken on the thread that used it, so a stack per
//! thread serves as well without any of it: a released connection is pushed, and the next request
//! to its peer takes the one pushed last, the one most likely still warm and open.
//!
//! No task watches each kept connection while it waits. One rule says whether a kept connection
//! may still be used (`Kept::usable`): it is within its peer's idle timeout (`idle_timeout`), and
//! has nothing to read (the peer has not closed it, nor sent bytes unasked: the pool's own
//! check). A request applies it to the connection it takes, and closes one that fails it instead;
//! once a second one task of the thread (spawned with its first kept connection) applies it to
//! them all: when requests stop, a connection the upstream closes is closed here within a second
//! (the pool's watcher closed it at once), and none outlives its idle timeout by more than that.
//! Pushing more than the most a thread keeps closes the oldest.
//!
//! Only HTTP/1 connections to peers that offer no other protocol are kept here; HTTP/2 and custom
//! protocols multiplex or pool their own way, and keep going through pingora's pool.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures::FutureExt;
use pingora_core::protocols::Stream;
use tokio::io::AsyncReadExt;

/// An idle connection, to the peer whose reuse hash is `peer`, closed if still idle at `until`.
struct Kept {
    peer: u64,
    until: Option<Instant>,
    stream: Stream,
}

/// How often a thread's sweep looks over the connections it keeps.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// This thread's idle connections, oldest first.
    static KEPT: RefCell<VecDeque<Kept>> = const { RefCell::new(VecDeque::new()) };
    /// Whether this thread's sweep has been started.
    static SWEEPING: Cell<bool> = const { Cell::new(false) };
}

impl Kept {
    /// Whether the connection may still be used at `now`: within its idle timeout, and with
    /// nothing to read ([`idle_and_open`]). Taking and sweeping close what is not.
    fn usable(&mut self, now: Instant) -> bool {
        self.until.is_none_or(|until| until > now) && idle_and_open(&mut self.stream)
    }
}

/// The idle connection to `peer` (a reuse hash) this thread kept last that is still usable at
/// `now`, if any; those of the peer it passes over on the way are closed.
pub(crate) fn take(peer: u64, now: Instant) -> Option<Stream> {
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        while let Some(i) = kept.iter().rposition(|k| k.peer == peer) {
            let mut candidate = kept.remove(i)?;
            if candidate.usable(now) {
                return Some(candidate.stream);
            }
        }
        None
    })
}

/// Keeps `stream`, an idle connection to `peer` (a reuse hash), on this thread for at most
/// `idle_timeout` from `since`; if the thread then keeps more than `most`, the oldest is closed.
///
/// `since` is when the request that used the connection began, the time `take` was given: the
/// connection is then closed no later than the pool would, or earlier by that request's
/// duration, and the request reads the clock once.
pub(crate) fn keep(
    peer: u64,
    stream: Stream,
    since: Instant,
    idle_timeout: Option<Duration>,
    most: usize,
) {
    if most == 0 {
        return;
    }
    if !SWEEPING.get() {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            SWEEPING.set(true);
            runtime.spawn(sweep());
        }
    }
    let until = idle_timeout.map(|idle| since + idle);
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() >= most {
            kept.pop_front();
        }
        kept.push_back(Kept {
            peer,
            until,
            stream,
        });
    })
}

/// Every [`SWEEP_EVERY`], closes this thread's kept connections that are past their idle timeout
/// or have anything to read. Spawned on the thread's runtime, which runs it on the same thread
/// when it is a runtime of one thread.
async fn sweep() {
    let first = tokio::time::Instant::now() + SWEEP_EVERY;
    let mut every = tokio::time::interval_at(first, SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now = Instant::now();
        KEPT.with(|kept| kept.borrow_mut().retain_mut(|k| k.usable(now)));
    }
}

/// Whether the idle `stream` has nothing to read: the peer has neither closed it nor sent bytes
/// nobody asked for (pingora's pool's check, `test_reusable_stream`). The read only looks at the
/// readiness the runtime already has, so a silent connection costs no system call; it is run
/// outside the task's budget, which would otherwise make a ready read look silent.
fn idle_and_open(stream: &mut Stream) -> bool {
    let mut byte = [0; 1];
    tokio::task::unconstrained(stream.read(&mut byte))
        .now_or_never()
        .is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair: ours (as pingora's `Stream`) and the peer's end.
    async fn pair(listener: &TcpListener) -> (Stream, TcpStream) {
        let (ours, theirs) = tokio::join!(
            TcpStream::connect(listener.local_addr().unwrap()),
            listener.accept()
        );
        let ours = pingora_core::protocols::l4::stream::Stream::from(ours.unwrap());
        (Box::new(ours), theirs.unwrap().0)
    }

    /// Which connection `stream` is (its file descriptor, unique among those open).
    fn id(stream: &Stream) -> i32 {
        stream.id()
    }

    /// Keeps `stream` from now.
    fn put(peer: u64, stream: Stream, idle_timeout: Option<Duration>, most: usize) {
        keep(peer, stream, Instant::now(), idle_timeout, most);
    }

    /// Which connection to `peer` a request now takes, if any.
    fn taken(peer: u64) -> Option<i32> {
        take(peer, Instant::now()).map(|s| id(&s))
    }

    /// Drops every connection this thread keeps, and forgets its sweep (tests may share a
    /// thread, each with a runtime of its own).
    fn clear() {
        KEPT.with(|kept| kept.borrow_mut().clear());
        SWEEPING.set(false);
    }

    /// How many connections this thread keeps.
    fn count() -> usize {
        KEPT.with(|kept| kept.borrow().len())
    }

    #[tokio::test]
    async fn the_last_kept_connection_to_the_peer_is_taken_and_others_stay() {
        clear();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a, _a) = pair(&listener).await;
        let (b, _b) = pair(&listener).await;
        let (c, _c) = pair(&listener).await;
        let (ia, ib, ic) = (id(&a), id(&b), id(&c));
        put(1, a, None, 8);
        put(1, b, None, 8);
        put(2, c, None, 8);
        assert_eq!(taken(1), Some(ib));
        assert_eq!(taken(2), Some(ic));
        assert_eq!(taken(2), None);
        assert_eq!(taken(1), Some(ia));
        assert!(taken(1).is_none());
    }

    #[tokio::test]
    async fn a_connection_the_peer_closed_or_wrote_to_is_closed_not_taken() {
        clear();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (open, _open) = pair(&listener).await;
        let (closed, theirs_closed) = pair(&listener).await;
        let (chatty, mut theirs_chatty) = pair(&listener).await;
        let open_id = id(&open);
        put(7, open, None, 8);
        put(7, closed, None, 8);
        put(7, chatty, None, 8);
        drop(theirs_closed);
        theirs_chatty
            .write_all(b"HTTP/1.1 408\r\n\r\n")
            .await
            .unwrap();
        // The close and the bytes reach the runtime's readiness of our ends.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(taken(7), Some(open_id));
        assert!(taken(7).is_none(), "the two passed over are gone");
    }

    #[tokio::test]
    async fn connections_idle_past_their_timeout_are_closed() {
        clear();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (old, mut theirs_old) = pair(&listener).await;
        put(3, old, Some(Duration::from_millis(50)), 8);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (fresh, _fresh) = pair(&listener).await;
        let fresh_id = id(&fresh);
        put(4, fresh, Some(Duration::from_secs(60)), 8);
        assert!(taken(5).is_none());
        // A request to its peer does not take the expired connection, and closes it...
        assert!(taken(3).is_none());
        let mut byte = [0; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), theirs_old.read(&mut byte));
        assert_eq!(read.await.unwrap().unwrap(), 0, "the peer sees the close");
        // ... and the fresh one stays.
        assert_eq!(taken(4), Some(fresh_id));
    }

    #[tokio::test]
    async fn while_no_request_comes_the_sweep_closes_what_the_peer_closed_or_idled_out() {
        clear();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (closed, theirs_closed) = pair(&listener).await;
        let (old, mut theirs_old) = pair(&listener).await;
        let (fresh, _fresh) = pair(&listener).await;
        let fresh_id = id(&fresh);
        put(1, closed, None, 8);
        put(2, old, Some(Duration::from_millis(50)), 8);
        put(3, fresh, Some(Duration::from_secs(60)), 8);
        drop(theirs_closed);
        // No request takes a connection: only the sweep closes any.
        let mut byte = [0; 1];
        let read = tokio::time::timeout(3 * SWEEP_EVERY, theirs_old.read(&mut byte));
        assert_eq!(
            read.await.unwrap().unwrap(),
            0,
            "the idled-out one is closed"
        );
        let waited = Instant::now();
        while count() > 1 && waited.elapsed() < 3 * SWEEP_EVERY {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(count(), 1, "the one its peer closed is gone too");
        assert_eq!(taken(3), Some(fresh_id));
    }

    #[tokio::test]
    async fn past_the_most_a_thread_keeps_the_oldest_is_closed() {
        clear();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut ids = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..3 {
            let (ours, their) = pair(&listener).await;
            ids.push(id(&ours));
            theirs.push(their);
            put(9, ours, None, 2);
        }
        let mut byte = [0; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), theirs[0].read(&mut byte));
        assert_eq!(read.await.unwrap().unwrap(), 0, "the oldest is closed");
        assert_eq!(taken(9), Some(ids[2]));
        assert_eq!(taken(9), Some(ids[1]));
        assert!(taken(9).is_none());
        put(9, pair(&listener).await.0, None, 0);
        assert!(taken(9).is_none(), "keeping none keeps none");
    }
}
