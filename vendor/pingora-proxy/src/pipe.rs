// Animal Store's patch (see `vendor/README.md` in its repository): this module.

//! The task pipes between the two halves of an HTTP/1 proxied request.
//!
//! `proxy_1to1` runs the downstream and the upstream half of a request side by side and passes
//! `HttpTask`s between them through two bounded channels. They were tokio's `mpsc` channels, made
//! for many senders across threads: a semaphore of permits under a mutex, a linked list of
//! 32-slot blocks, and two allocations a channel, for the five tasks of a proxied GET. A pipe has
//! one sender and one receiver, a ring of `N` slots inline, and one mutex that each operation
//! takes once: 1,900 instructions a GET fewer (callgrind). What `proxy_h1` relies on is kept:
//!
//! - bounded: `send` and `reserve` wait while the `N` slots are taken or promised to permits;
//! - `recv` is `None` once the sender is gone and the ring is empty, and is cancel safe (a task
//!   is taken only by the poll that returns it);
//! - `send` and `reserve` fail, and `is_closed` is true, once the receiver is gone;
//! - a permit dropped unused gives its slot back;
//! - a receiver dropped drops the tasks still in the ring.

use std::fmt;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// A pipe of at most `N` values in flight.
pub(crate) fn channel<T, const N: usize>() -> (Sender<T, N>, Receiver<T, N>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            ring: std::array::from_fn(|_| None),
            head: 0,
            len: 0,
            promised: 0,
            sender: true,
            receiver: true,
            rx_waker: None,
            tx_waker: None,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

struct Shared<T, const N: usize> {
    state: Mutex<State<T, N>>,
}

impl<T, const N: usize> Shared<T, N> {
    fn lock(&self) -> MutexGuard<'_, State<T, N>> {
        // No code under the lock can panic but a value's own drop; the state stays whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State<T, const N: usize> {
    ring: [Option<T>; N],
    head: usize,
    len: usize,
    /// Slots promised to permits not yet used.
    promised: usize,
    sender: bool,
    receiver: bool,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
}

impl<T, const N: usize> State<T, N> {
    fn has_room(&self) -> bool {
        self.len + self.promised < N
    }

    fn push(&mut self, value: T) {
        debug_assert!(self.len < N);
        self.ring[(self.head + self.len) % N] = Some(value);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let value = self.ring[self.head].take();
        self.head = (self.head + 1) % N;
        self.len -= 1;
        value
    }
}

/// Puts `value` in the ring under `state` (which has room for it), then, with the lock
/// released, wakes the receiver if it waits.
fn deliver<T, const N: usize>(mut state: MutexGuard<'_, State<T, N>>, value: T) {
    state.push(value);
    let waker = state.rx_waker.take();
    drop(state);
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// Keeps `cx`'s waker in `slot`, unless the one there already wakes the same task.
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// Why a value could not be sent or a slot reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PipeError {
    /// The receiver is gone.
    Closed,
    /// Every slot is taken (`try_reserve` only).
    Full,
}

impl fmt::Display for PipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipeError::Closed => f.write_str("task pipe closed"),
            PipeError::Full => f.write_str("task pipe full"),
        }
    }
}

impl std::error::Error for PipeError {}

/// The sending end of a pipe.
pub(crate) struct Sender<T, const N: usize> {
    shared: Arc<Shared<T, N>>,
}

impl<T, const N: usize> Sender<T, N> {
    /// The state, locked, once it has a free slot; `Closed` if the receiver is gone. Without a
    /// context, `Full` instead of waiting; with one, its task is woken when a slot frees.
    fn room(
        &self,
        cx: Option<&Context<'_>>,
    ) -> Poll<Result<MutexGuard<'_, State<T, N>>, PipeError>> {
        let mut state = self.shared.lock();
        if !state.receiver {
            return Poll::Ready(Err(PipeError::Closed));
        }
        if state.has_room() {
            return Poll::Ready(Ok(state));
        }
        match cx {
            Some(cx) => {
                register(&mut state.tx_waker, cx);
                Poll::Pending
            }
            None => Poll::Ready(Err(PipeError::Full)),
        }
    }

    /// Sends `value` once a slot is free; fails if the receiver is gone (and drops `value`).
    /// The slot is found and filled under one lock.
    pub(crate) async fn send(&self, value: T) -> Result<(), PipeError> {
        let state = poll_fn(|cx| self.room(Some(cx))).await?;
        deliver(state, value);
        Ok(())
    }

    /// Waits for a slot and promises it to the permit returned; fails if the receiver is gone.
    pub(crate) async fn reserve(&self) -> Result<Permit<'_, T, N>, PipeError> {
        let mut state = poll_fn(|cx| self.room(Some(cx))).await?;
        state.promised += 1;
        Ok(Permit { sender: self })
    }

    /// A permit for a free slot, now.
    pub(crate) fn try_reserve(&self) -> Result<Permit<'_, T, N>, PipeError> {
        let Poll::Ready(room) = self.room(None) else {
            unreachable!("without a context, room never waits")
        };
        room?.promised += 1;
        Ok(Permit { sender: self })
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        !self.shared.lock().receiver
    }
}

impl<T, const N: usize> Drop for Sender<T, N> {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.shared.lock();
            state.sender = false;
            state.rx_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T, const N: usize> fmt::Debug for Sender<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("pipe::Sender")
    }
}

/// A slot promised to one value.
pub(crate) struct Permit<'a, T, const N: usize> {
    sender: &'a Sender<T, N>,
}

impl<T, const N: usize> Permit<'_, T, N> {
    /// Sends `value` into the promised slot. If the receiver is gone, `value` is dropped.
    pub(crate) fn send(self, value: T) {
        let sender = self.sender;
        std::mem::forget(self);
        let mut state = sender.shared.lock();
        state.promised -= 1;
        if state.receiver {
            deliver(state, value);
        }
        // Otherwise `value` is dropped after the lock is released (locals go before arguments).
    }
}

impl<T, const N: usize> Drop for Permit<'_, T, N> {
    fn drop(&mut self) {
        // Unused: its slot is free again, for a sender that may be waiting on it.
        let waker = {
            let mut state = self.sender.shared.lock();
            state.promised -= 1;
            state.tx_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T, const N: usize> fmt::Debug for Permit<'_, T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("pipe::Permit")
    }
}

/// The receiving end of a pipe.
pub(crate) struct Receiver<T, const N: usize> {
    shared: Arc<Shared<T, N>>,
}

impl<T, const N: usize> Receiver<T, N> {
    /// The next value; `None` once the sender is gone and every value sent was received.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.shared.lock();
        if let Some(value) = state.pop() {
            let waker = state.tx_waker.take();
            drop(state);
            if let Some(waker) = waker {
                waker.wake();
            }
            return Poll::Ready(Some(value));
        }
        if !state.sender {
            return Poll::Ready(None);
        }
        register(&mut state.rx_waker, cx);
        Poll::Pending
    }
}

impl<T, const N: usize> Drop for Receiver<T, N> {
    fn drop(&mut self) {
        let (left, waker) = {
            let mut state = self.shared.lock();
            state.receiver = false;
            state.len = 0;
            let left = std::mem::replace(&mut state.ring, std::array::from_fn(|_| None));
            (left, state.tx_waker.take())
        };
        // The values left are dropped outside the lock.
        drop(left);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T, const N: usize> fmt::Debug for Receiver<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("pipe::Receiver")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::Duration;

    #[tokio::test]
    async fn values_arrive_in_order_and_then_the_end() {
        let (tx, mut rx) = channel::<u32, 4>();
        for i in 0..3 {
            tx.send(i).await.unwrap();
        }
        drop(tx);
        assert_eq!(rx.recv().await, Some(0));
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, None);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn the_ring_wraps_around() {
        let (tx, mut rx) = channel::<u32, 2>();
        for i in 0..10 {
            tx.send(i).await.unwrap();
            assert_eq!(rx.recv().await, Some(i));
        }
    }

    #[tokio::test]
    async fn a_full_pipe_makes_the_sender_wait_until_a_value_is_received() {
        let (tx, mut rx) = channel::<u32, 2>();
        tx.send(1).await.unwrap();
        let permit = tx.try_reserve().unwrap();
        // Two slots: one taken, one promised.
        assert_eq!(tx.try_reserve().unwrap_err(), PipeError::Full);
        assert!(tx.send(3).now_or_never().is_none());
        permit.send(2);
        let sender = tokio::spawn(async move {
            tx.send(3).await.unwrap();
            tx
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sender.is_finished());
        assert_eq!(rx.recv().await, Some(1));
        let tx = tokio::time::timeout(Duration::from_secs(5), sender)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(3));
        drop(tx);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_permit_dropped_unused_frees_its_slot_for_a_waiting_sender() {
        let (tx, mut rx) = channel::<u32, 1>();
        let tx = Arc::new(tx);
        let permit = tx.try_reserve().unwrap();
        let waiting = {
            let tx = tx.clone();
            tokio::spawn(async move { tx.reserve().await.map(|p| p.send(7)) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(permit);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(rx.recv().await, Some(7));
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_value_and_by_the_senders_end() {
        let (tx, mut rx) = channel::<u32, 4>();
        let receiver = tokio::spawn(async move {
            let first = rx.recv().await;
            let second = rx.recv().await;
            (first, second)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(5).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!receiver.is_finished());
        drop(tx);
        let got = tokio::time::timeout(Duration::from_secs(5), receiver)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, (Some(5), None));
    }

    #[tokio::test]
    async fn without_the_receiver_sends_fail_and_a_waiting_sender_is_woken() {
        let (tx, rx) = channel::<Arc<()>, 1>();
        let value = Arc::new(());
        tx.send(value.clone()).await.unwrap();
        let tx = Arc::new(tx);
        let waiting = {
            let tx = tx.clone();
            tokio::spawn(async move { tx.reserve().await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!tx.is_closed());
        drop(rx);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, Err(PipeError::Closed));
        // The value left in the pipe went with the receiver.
        assert_eq!(Arc::strong_count(&value), 1);
        assert!(tx.is_closed());
        assert_eq!(tx.send(Arc::new(())).await, Err(PipeError::Closed));
        assert_eq!(tx.try_reserve().unwrap_err(), PipeError::Closed);
    }

    #[tokio::test]
    async fn a_permit_used_after_the_receiver_went_drops_its_value() {
        let (tx, rx) = channel::<Arc<()>, 1>();
        let permit = tx.try_reserve().unwrap();
        drop(rx);
        let value = Arc::new(());
        permit.send(value.clone());
        assert_eq!(Arc::strong_count(&value), 1);
    }

    #[tokio::test]
    async fn a_receive_cancelled_before_its_value_loses_nothing() {
        let (tx, mut rx) = channel::<u32, 4>();
        // Polled once and dropped while empty, as `select!` and `now_or_never` do.
        assert!(rx.recv().now_or_never().is_none());
        tx.send(9).await.unwrap();
        assert_eq!(rx.recv().now_or_never(), Some(Some(9)));
        assert!(rx.recv().now_or_never().is_none());
    }

    #[test]
    fn pipes_cross_threads() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        runtime.block_on(async {
            let (tx, mut rx) = channel::<u64, 4>();
            let sender = tokio::spawn(async move {
                for i in 0..10_000u64 {
                    tx.send(i).await.unwrap();
                }
            });
            let mut expected = 0;
            while let Some(i) = rx.recv().await {
                assert_eq!(i, expected);
                expected += 1;
            }
            assert_eq!(expected, 10_000);
            sender.await.unwrap();
        });
    }
}
