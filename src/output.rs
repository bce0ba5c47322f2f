//! The live output of a session: assistant text, buffered between the session (producer) and
//! the engine's `for await` (consumer). The producer never waits: a consumer that reads slowly
//! or not at all must not stall the agent. Unread text is bounded; past the bound the oldest is
//! dropped and the consumer gets one marker line saying how much (the transcript keeps all).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

pub const DEFAULT_BOUND: usize = 16 * 1024 * 1024;

#[derive(Default)]
struct State {
    chunks: VecDeque<String>,
    bytes: usize,
    dropped: usize,
    closed: bool,
    detached: bool,
}

pub struct OutputBuffer {
    state: Mutex<State>,
    notify: Notify,
    bound: usize,
}

impl OutputBuffer {
    pub fn new(bound: usize) -> Arc<Self> {
        Arc::new(OutputBuffer {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            bound,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn push(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        {
            let mut s = self.lock();
            if s.closed || s.detached {
                return;
            }
            s.bytes += text.len();
            s.chunks.push_back(text.to_string());
            while s.bytes > self.bound && s.chunks.len() > 1 {
                let old = s.chunks.pop_front().expect("len > 1");
                s.bytes -= old.len();
                s.dropped += old.len();
            }
        }
        self.notify.notify_one();
    }

    /// The session has ended: the consumer gets what is buffered, then the end.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    /// The consumer stopped reading (`break`): keep nothing more for it. The agent goes on.
    pub fn detach(&self) {
        let mut s = self.lock();
        s.detached = true;
        s.chunks.clear();
        s.bytes = 0;
        drop(s);
        self.notify.notify_one();
    }

    /// The next chunk, or `None` once the session has ended and everything was read.
    pub async fn next(&self) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.lock();
                if s.detached {
                    return None;
                }
                if s.dropped > 0 {
                    let n = std::mem::take(&mut s.dropped);
                    return Some(format!(
                        "\n[claude-runtime-adapter: {n} bytes of unread output were dropped; the transcript has all of it]\n"
                    ));
                }
                if let Some(c) = s.chunks.pop_front() {
                    s.bytes -= c.len();
                    return Some(c);
                }
                if s.closed {
                    return None;
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn text_comes_out_in_order_then_ends_after_close() {
        let b = OutputBuffer::new(1024);
        b.push("a");
        b.push("b");
        b.close();
        assert_eq!(b.next().await.as_deref(), Some("a"));
        assert_eq!(b.next().await.as_deref(), Some("b"));
        assert_eq!(b.next().await, None);
    }

    #[tokio::test]
    async fn unread_output_past_the_bound_drops_the_oldest_with_one_marker() {
        let b = OutputBuffer::new(10);
        for _ in 0..5 {
            b.push("12345");
        }
        b.close();
        let marker = b.next().await.unwrap();
        assert!(
            marker.contains("15 bytes of unread output were dropped"),
            "{marker}"
        );
        assert_eq!(b.next().await.as_deref(), Some("12345"));
        assert_eq!(b.next().await.as_deref(), Some("12345"));
        assert_eq!(b.next().await, None);
    }

    #[tokio::test]
    async fn a_detached_consumer_ends_and_nothing_more_is_kept() {
        let b = OutputBuffer::new(10);
        b.push("x");
        b.detach();
        b.push("y");
        assert_eq!(b.next().await, None);
        assert_eq!(b.lock().bytes, 0);
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_on_push() {
        let b = OutputBuffer::new(100);
        let b2 = b.clone();
        let reader = tokio::spawn(async move { b2.next().await });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        b.push("late");
        assert_eq!(reader.await.unwrap().as_deref(), Some("late"));
    }
}
