//! The live output of a session: assistant text, kept in one shared append-only log that any
//! number of readers replay from the start (a terminal UI attaching late, a logger beside it).
//!
//! - The producer never waits: `push` appends under a short lock and wakes the readers; a
//!   reader that reads slowly or not at all cannot stall the agent.
//! - Memory is bounded: the log keeps the last `bound` bytes (whole chunks; the newest chunk is
//!   always kept). A reader whose position was dropped gets one marker line saying how many
//!   bytes it missed, then continues from the oldest kept chunk (the transcript keeps all).
//! - Positions are absolute byte offsets since the session started, so dropping old chunks
//!   never moves a reader.
//! - Each reader ends on its own (`detach`, i.e. `break` out of `for await`); the others and
//!   the agent go on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

pub const DEFAULT_BOUND: usize = 16 * 1024 * 1024;

struct Chunk {
    /// Absolute offset of the chunk's first byte.
    start: u64,
    text: Arc<str>,
}

#[derive(Default)]
struct Log {
    chunks: VecDeque<Chunk>,
    /// Bytes held in `chunks`.
    bytes: usize,
    /// Absolute offset one past the last byte ever pushed.
    end: u64,
    closed: bool,
}

impl Log {
    /// Absolute offset of the oldest byte still kept.
    fn first_kept(&self) -> u64 {
        self.chunks.front().map_or(self.end, |c| c.start)
    }
}

pub struct OutputBuffer {
    log: Mutex<Log>,
    notify: Notify,
    bound: usize,
}

impl OutputBuffer {
    pub fn new(bound: usize) -> Arc<Self> {
        Arc::new(OutputBuffer {
            log: Mutex::new(Log::default()),
            notify: Notify::new(),
            bound,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn push(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        {
            let mut log = self.lock();
            if log.closed {
                return;
            }
            let start = log.end;
            log.end += text.len() as u64;
            log.bytes += text.len();
            log.chunks.push_back(Chunk {
                start,
                text: Arc::from(text),
            });
            while log.bytes > self.bound && log.chunks.len() > 1 {
                let old = log.chunks.pop_front().expect("len > 1");
                log.bytes -= old.text.len();
            }
        }
        self.notify.notify_waiters();
    }

    /// The session has ended: each reader gets what it has not read yet, then the end.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// A new reader positioned at the first chunk the session ever produced.
    pub fn reader(self: &Arc<Self>) -> OutputReader {
        OutputReader {
            buffer: self.clone(),
            state: Arc::new(ReaderState::default()),
        }
    }
}

#[derive(Default)]
struct ReaderState {
    /// Absolute offset of the next byte this reader gets; always a chunk boundary.
    cursor: AtomicU64,
    detached: AtomicBool,
}

/// One reader's position in an [`OutputBuffer`]. Clones share the position (the binding moves a
/// clone into each `next()` future).
#[derive(Clone)]
pub struct OutputReader {
    buffer: Arc<OutputBuffer>,
    state: Arc<ReaderState>,
}

/// What a reader gets where the log no longer holds its position.
pub fn dropped_marker(bytes: u64) -> String {
    format!(
        "\n[claude-runtime-adapter: {bytes} bytes of earlier output were dropped (only the last {} MiB are kept); the transcript has all of it]\n",
        DEFAULT_BOUND / (1024 * 1024)
    )
}

impl OutputReader {
    /// The next chunk, or `None` once the session has ended and everything was read, or this
    /// reader was detached.
    pub async fn next(&self) -> Option<String> {
        loop {
            let notified = self.buffer.notify.notified();
            if let Some(step) = self.try_next() {
                return step;
            }
            notified.await;
        }
    }

    /// `Some(answer)` when `next` can answer now, `None` when it has to wait.
    fn try_next(&self) -> Option<Option<String>> {
        if self.state.detached.load(Ordering::Acquire) {
            return Some(None);
        }
        // The cursor is read and advanced under the log's lock, so concurrent `next` calls on
        // one reader still hand out each chunk once.
        let log = self.buffer.lock();
        let cursor = self.state.cursor.load(Ordering::Acquire);
        let first = log.first_kept();
        if cursor < first {
            self.state.cursor.store(first, Ordering::Release);
            return Some(Some(dropped_marker(first - cursor)));
        }
        if cursor < log.end {
            let i = log.chunks.partition_point(|c| c.start < cursor);
            let chunk = &log.chunks[i];
            debug_assert_eq!(chunk.start, cursor, "cursors sit on chunk boundaries");
            self.state
                .cursor
                .store(chunk.start + chunk.text.len() as u64, Ordering::Release);
            return Some(Some(chunk.text.to_string()));
        }
        if log.closed {
            return Some(None);
        }
        None
    }

    /// This reader stops (`break` out of its loop): its pending and later `next` calls end.
    /// Other readers and the producer are not affected.
    pub fn detach(&self) {
        self.state.detached.store(true, Ordering::Release);
        self.buffer.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn read_all(r: &OutputReader) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(c) = r.next().await {
            out.push(c);
        }
        out
    }

    #[tokio::test]
    async fn text_comes_out_in_order_then_ends_after_close() {
        let b = OutputBuffer::new(1024);
        let r = b.reader();
        b.push("a");
        b.push("b");
        b.close();
        assert_eq!(read_all(&r).await, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_reader_created_after_the_end_replays_everything() {
        let b = OutputBuffer::new(1024);
        let early = b.reader();
        b.push("one ");
        b.push("two");
        assert_eq!(early.next().await.as_deref(), Some("one "));
        b.close();
        let late = b.reader();
        assert_eq!(read_all(&late).await.concat(), "one two");
        assert_eq!(read_all(&early).await, ["two"]);
    }

    #[tokio::test]
    async fn a_late_reader_gets_one_marker_for_what_was_dropped_then_the_kept_tail() {
        let b = OutputBuffer::new(10);
        for _ in 0..5 {
            b.push("12345");
        }
        b.close();
        let got = read_all(&b.reader()).await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[0].contains("15 bytes of earlier output were dropped"),
            "{}",
            got[0]
        );
        assert_eq!(&got[1..], ["12345", "12345"]);
    }

    #[tokio::test]
    async fn a_slow_reader_that_falls_behind_gets_a_marker_and_resumes() {
        let b = OutputBuffer::new(10);
        let r = b.reader();
        b.push("aaaaa");
        assert_eq!(r.next().await.as_deref(), Some("aaaaa"));
        for s in ["bbbbb", "ccccc", "ddddd"] {
            b.push(s);
        }
        b.close();
        let got = read_all(&r).await;
        assert!(got[0].contains(" 5 bytes of earlier output"), "{}", got[0]);
        assert_eq!(&got[1..], ["ccccc", "ddddd"]);
    }

    #[tokio::test]
    async fn memory_stays_bounded_but_the_newest_chunk_is_always_kept() {
        let b = OutputBuffer::new(10);
        b.push("x".repeat(100).as_str());
        b.push("small");
        assert_eq!(b.lock().bytes, 5);
        b.push("y".repeat(50).as_str());
        assert_eq!(b.lock().bytes, 50);
        assert_eq!(b.lock().chunks.len(), 1);
    }

    #[tokio::test]
    async fn detaching_one_reader_ends_it_and_not_the_others() {
        let b = OutputBuffer::new(1024);
        let a = b.reader();
        let other = b.reader();
        b.push("x");
        let waiting = {
            let a = a.clone();
            tokio::spawn(async move {
                let first = a.next().await;
                let second = a.next().await;
                (first, second)
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.detach();
        let (first, second) = waiting.await.unwrap();
        assert_eq!(first.as_deref(), Some("x"));
        assert_eq!(second, None, "the detached reader's pending next ends");
        b.push("y");
        b.close();
        assert_eq!(a.next().await, None);
        assert_eq!(read_all(&other).await, ["x", "y"]);
    }

    #[tokio::test]
    async fn every_waiting_reader_wakes_on_push() {
        let b = OutputBuffer::new(100);
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let r = b.reader();
                tokio::spawn(async move { r.next().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.push("late");
        for r in readers {
            assert_eq!(r.await.unwrap().as_deref(), Some("late"));
        }
    }

    #[tokio::test]
    async fn concurrent_next_calls_on_one_reader_hand_out_each_chunk_once() {
        let b = OutputBuffer::new(1 << 20);
        let r = b.reader();
        for i in 0..200 {
            b.push(&format!("{i},"));
        }
        b.close();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                tokio::spawn(async move { read_all(&r).await })
            })
            .collect();
        let mut all: Vec<String> = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort_by_key(|s| s.trim_end_matches(',').parse::<u32>().unwrap());
        let expected: Vec<String> = (0..200).map(|i| format!("{i},")).collect();
        assert_eq!(all, expected);
    }

    #[tokio::test]
    async fn pushes_after_close_are_ignored() {
        let b = OutputBuffer::new(100);
        b.push("a");
        b.close();
        b.push("b");
        assert_eq!(read_all(&b.reader()).await, ["a"]);
    }
}
