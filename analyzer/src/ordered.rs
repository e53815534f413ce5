//! Work on many items in parallel, results consumed in the items' order.
//!
//! Each worker takes the next item as soon as it has finished one, so no
//! worker waits for a slower neighbour (a batch at a time, the slowest
//! segment of each batch held every other worker idle). A worker begins
//! no item more than `ahead` past the one being consumed: results wait in
//! memory only that far (a listing's result is about 25 MB of text per
//! segment). rayon's ordered iterators collect everything or nothing;
//! this is the bounded, streaming middle.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// What the workers and the consumer share.
struct State<T> {
    /// The next item a worker begins.
    next: usize,
    /// Items consumed so far: `done[0]` is item `consumed`'s result.
    consumed: usize,
    done: VecDeque<Option<T>>,
    /// No worker begins another item: the consumer stopped, or a worker
    /// panicked.
    stop: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// A result came, or the work stopped.
    ready: Condvar,
    /// The consumer took a result (room for another), or the work stopped.
    room: Condvar,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panicking worker holds no lock while it works; the state stays
        // whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.ready.notify_all();
        self.room.notify_all();
    }
}

/// Stops the work when a worker or the consumer unwinds, so whoever waits
/// for the other wakes (and the panic reaches the caller when the scope
/// ends).
struct StopOnPanic<'a, T>(&'a Shared<T>);

impl<T> Drop for StopOnPanic<'_, T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop();
        }
    }
}

/// Runs `work` on each of `items` on `workers` threads and hands each
/// result to `consume` in the items' order, at most `ahead` (at least 1)
/// past the one being consumed. `consume`'s first error ends the run (no
/// item begins after it) and is returned.
pub(crate) fn map_in_order<I, T, E>(
    items: &[I],
    workers: usize,
    ahead: usize,
    work: impl Fn(&I) -> T + Sync,
    mut consume: impl FnMut(T) -> Result<(), E>,
) -> Result<(), E>
where
    I: Sync,
    T: Send,
{
    let ahead = ahead.max(1);
    let shared = Shared {
        state: Mutex::new(State {
            next: 0,
            consumed: 0,
            done: VecDeque::new(),
            stop: false,
        }),
        ready: Condvar::new(),
        room: Condvar::new(),
    };
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, items.len().max(1)) {
            scope.spawn(|| {
                let _guard = StopOnPanic(&shared);
                while let Some(index) = begin(&shared, items.len(), ahead) {
                    let result = work(&items[index]);
                    let mut state = shared.lock();
                    let slot = index - state.consumed;
                    if state.done.len() <= slot {
                        state.done.resize_with(slot + 1, || None);
                    }
                    state.done[slot] = Some(result);
                    drop(state);
                    shared.ready.notify_all();
                }
            });
        }
        // A panic in `consume` must not leave the workers waiting for room.
        let _guard = StopOnPanic(&shared);
        let mut outcome = Ok(());
        for _ in 0..items.len() {
            let Some(result) = take_next(&shared) else {
                break; // a worker panicked: the scope passes it on
            };
            if let Err(e) = consume(result) {
                outcome = Err(e);
                break;
            }
        }
        shared.stop();
        outcome
    })
}

/// The next item for a worker, once it is within `ahead` of the one being
/// consumed; `None` when there is none left or the work stopped.
fn begin<T>(shared: &Shared<T>, count: usize, ahead: usize) -> Option<usize> {
    let mut state = shared.lock();
    loop {
        if state.stop || state.next >= count {
            return None;
        }
        if state.next < state.consumed.saturating_add(ahead) {
            state.next += 1;
            return Some(state.next - 1);
        }
        state = shared
            .room
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// The result of the next item in order, once it is there; `None` when
/// the work stopped first.
fn take_next<T>(shared: &Shared<T>) -> Option<T> {
    let mut state = shared.lock();
    loop {
        if let Some(result) = state.done.front_mut().and_then(Option::take) {
            state.done.pop_front();
            state.consumed += 1;
            drop(state);
            shared.room.notify_all();
            return Some(result);
        }
        if state.stop {
            return None;
        }
        state = shared
            .ready
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn results_come_in_order_whatever_each_takes() {
        let items: Vec<u64> = (0..200).collect();
        let mut seen = Vec::new();
        let outcome: Result<(), ()> = map_in_order(
            &items,
            4,
            3,
            |i| {
                // Later items often finish first.
                std::thread::sleep(Duration::from_micros((i * 7919) % 500));
                i * 2
            },
            |r| {
                seen.push(r);
                Ok(())
            },
        );
        assert_eq!(outcome, Ok(()));
        assert_eq!(seen, items.iter().map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn no_item_begins_more_than_ahead_past_the_consumed() {
        let items: Vec<usize> = (0..100).collect();
        let consumed = AtomicUsize::new(0);
        let furthest = AtomicUsize::new(0);
        let _: Result<(), ()> = map_in_order(
            &items,
            4,
            2,
            |i| {
                let gap = i - consumed.load(Ordering::SeqCst);
                furthest.fetch_max(gap, Ordering::SeqCst);
            },
            |()| {
                std::thread::sleep(Duration::from_micros(200));
                consumed.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        );
        // Item `consumed + 1` may begin while item `consumed` is being
        // consumed (the count moves after): 2 ahead is a gap of 2 at most.
        assert!(furthest.load(Ordering::SeqCst) <= 2, "{furthest:?}");
    }

    #[test]
    fn an_error_ends_the_work_early() {
        let items: Vec<usize> = (0..10_000).collect();
        let begun = AtomicUsize::new(0);
        let outcome = map_in_order(
            &items,
            2,
            4,
            |i| {
                begun.fetch_add(1, Ordering::SeqCst);
                *i
            },
            |i| if i == 5 { Err(i) } else { Ok(()) },
        );
        assert_eq!(outcome, Err(5));
        assert!(begun.load(Ordering::SeqCst) <= 5 + 1 + 4, "{begun:?}");
    }

    #[test]
    fn a_panicking_worker_reaches_the_caller_and_nothing_hangs() {
        let items: Vec<usize> = (0..50).collect();
        let caught = std::panic::catch_unwind(|| {
            let _: Result<(), ()> =
                map_in_order(&items, 2, 2, |i| assert!(*i != 7, "item 7"), |()| Ok(()));
        });
        assert!(caught.is_err());
    }

    #[test]
    fn a_panicking_consumer_reaches_the_caller_and_nothing_hangs() {
        let items: Vec<usize> = (0..50).collect();
        let caught = std::panic::catch_unwind(|| {
            let _: Result<(), ()> = map_in_order(
                &items,
                2,
                2,
                |i| *i,
                |i| {
                    assert!(i != 3, "item 3");
                    Ok(())
                },
            );
        });
        assert!(caught.is_err());
    }

    #[test]
    fn no_items_is_no_work() {
        let outcome: Result<(), ()> = map_in_order(&[] as &[u8], 2, 2, |_| (), |()| Err(()));
        assert_eq!(outcome, Ok(()));
    }
}
