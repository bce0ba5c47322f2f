//! A session's use of the engine's disk, and the floor the engine's filesystem is kept above
//! (`sandbox.limits.diskMiB`, `sandbox.limits.diskFloorMiB`; docs/security.md, "Disk").
//!
//! No kernel mechanism bounds what a session writes in total on the engine's disk: its checkout
//! (a layer's `upper`, or a full clone) and the CLI's config dir are directories of the host's
//! filesystem, not a size-bounded mount (a tmpfs is RAM; a loop-mounted image or a project
//! quota needs the host's root and a filesystem made for it). So a [`DiskWatch`] per session
//! measures the session's directories — the allocated size (`st_blocks`, so a sparse file counts
//! what it holds, not its length), read with `lstat` (a link is counted, never followed), each
//! file with several links once, bounded in entries ([`MAX_ENTRIES`]) — every [`WATCH_EVERY`],
//! and sooner the faster it nears its bound or the floor (down to [`SOONEST`]), and at once
//! when its filesystem's free space falls by more than the session has left of its bound
//! (a `statvfs` every [`SOONEST`]: at 2 GB/s a session passes its bound by some tens of
//! megabytes before it is stopped, however long the walk's own wait), and calls its `on_hit`
//! once with the words of what it found: the session past its bound
//! (what it added since the watch started), or the filesystem below its floor with this
//! session the one of those running on it that added the most (one at a time: the next only
//! once the first one's watch is dropped, i.e. once its directories are gone). A walk takes
//! at most a twentieth of the watcher's time ([`WAIT_PER_WALK`]): a session with many files is
//! measured less often rather than costing the engine more. The kernel's help is per file
//! (`RLIMIT_FSIZE`, set by the sandbox at the bound): a single runaway file stops at the bound
//! at once, whatever the watcher's interval.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::DiskFloor;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// How often a session's directories are measured while it writes slowly, or not at all
/// ([`paced`] looks sooner as it nears its bound; [`WAIT_PER_WALK`] later for a large walk).
pub const WATCH_EVERY: Duration = Duration::from_millis(250);
/// The least wait between two looks, for a session nearing its bound (or the floor) fast.
const SOONEST: Duration = Duration::from_millis(20);
/// The wait after a walk is at least this many times the walk's own time.
const WAIT_PER_WALK: u32 = 20;
/// The most entries (files, directories, links) one walk reads. A session with more is past
/// what the watcher can measure, which with a bound stops it (fail-closed): far more than a
/// checkout with its dependencies holds (a large monorepo's `node_modules`: a few 100,000).
pub const MAX_ENTRIES: u64 = 2_000_000;
/// Within this of the floor, every session's directories are measured even without a bound
/// (so that which session wrote most is known when the floor is reached).
const NEAR_FLOOR: u64 = GIB;
/// The default floor: the larger of this and [`DEFAULT_FLOOR_PERCENT`] of the filesystem.
const DEFAULT_FLOOR_MIN: u64 = 2 * GIB;
const DEFAULT_FLOOR_PERCENT: u64 = 5;

/// What a walk of a session's directories found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allocated {
    /// Bytes the filesystem holds for them (`st_blocks` × 512).
    pub bytes: u64,
    /// Entries read.
    pub entries: u64,
    /// False when the walk stopped at `max_entries` or a directory could not be read: `bytes`
    /// is then less than they hold.
    pub complete: bool,
}

/// The allocated size of everything under `roots` (each one's own filesystem only; a missing
/// root holds nothing), reading at most `max_entries` entries. Links are not followed; a file
/// with several links is counted once.
pub fn allocated(roots: &[PathBuf], max_entries: u64) -> Allocated {
    let mut out = Allocated {
        complete: true,
        ..Allocated::default()
    };
    let mut seen = HashSet::new();
    for root in roots {
        let Ok(meta) = std::fs::symlink_metadata(root) else {
            continue;
        };
        let dev = id(&meta).0;
        let mut pending = vec![(root.clone(), meta)];
        while let Some((path, meta)) = pending.pop() {
            if out.entries >= max_entries {
                out.complete = false;
                return out;
            }
            out.entries += 1;
            let linked = !meta.is_dir() && links(&meta) > 1;
            if !linked || seen.insert(id(&meta)) {
                out.bytes += blocks(&meta);
            }
            if !meta.is_dir() || id(&meta).0 != dev {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&path) else {
                out.complete = false;
                continue;
            };
            for entry in entries.flatten() {
                // Gone since it was listed: it holds nothing now.
                if let Ok(m) = std::fs::symlink_metadata(entry.path()) {
                    pending.push((entry.path(), m));
                }
            }
        }
    }
    out
}

#[cfg(unix)]
fn blocks(m: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(m).saturating_mul(512)
}
#[cfg(not(unix))]
fn blocks(m: &std::fs::Metadata) -> u64 {
    m.len()
}

/// (device, inode).
#[cfg(unix)]
fn id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}
#[cfg(not(unix))]
fn id(_: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

#[cfg(unix)]
fn links(m: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::nlink(m)
}
#[cfg(not(unix))]
fn links(_: &std::fs::Metadata) -> u64 {
    1
}

/// A filesystem's size and what of it is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged process may still write (`f_bavail`: root's reserve not counted).
    pub free: u64,
    pub total: u64,
}

/// The space of the filesystem holding `path` (`None` where it cannot be read).
#[cfg(unix)]
pub fn space(path: &Path) -> Option<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs(3) with a NUL-terminated path and a zeroed struct it fills.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // c_ulong and fsblkcnt_t differ by platform.
    let (unit, free, total) = (s.f_frsize as u64, s.f_bavail as u64, s.f_blocks as u64);
    Some(Space {
        free: free.saturating_mul(unit),
        total: total.saturating_mul(unit),
    })
}
#[cfg(not(unix))]
pub fn space(_: &Path) -> Option<Space> {
    None
}

/// The floor in bytes on a filesystem of `total` bytes (`None`: off).
pub fn floor_bytes(floor: DiskFloor, total: u64) -> Option<u64> {
    match floor {
        DiskFloor::Off => None,
        DiskFloor::Bytes(b) => Some(b),
        DiskFloor::Default => Some(DEFAULT_FLOOR_MIN.max(total / 100 * DEFAULT_FLOOR_PERCENT)),
    }
}

/// The floor a session's filesystem is kept above.
#[derive(Debug, Clone)]
pub struct Floor {
    /// A path on the filesystem (`<repoRoot>/.worktrees`, or the repository).
    pub path: PathBuf,
    pub bytes: u64,
    /// True when it is the default (not `diskFloorMiB`), which the words say.
    pub default: bool,
}

impl Floor {
    /// The floor of `config` on the filesystem holding `path`; `Err` with the words of why
    /// no session may start there now (it is below the floor). `Ok(None)`: no floor (off, or
    /// the filesystem cannot be read).
    pub fn check(path: &Path, config: DiskFloor) -> Result<Option<Floor>, String> {
        let Some(s) = space(path) else {
            return Ok(None);
        };
        let Some(bytes) = floor_bytes(config, s.total) else {
            return Ok(None);
        };
        let floor = Floor {
            path: path.to_path_buf(),
            bytes,
            default: config == DiskFloor::Default,
        };
        if s.free < bytes {
            return Err(format!(
                "{}: no session starts until more is free",
                floor.below(s.free)
            ));
        }
        Ok(Some(floor))
    }

    /// "the engine's filesystem (…) has 1.2 GiB free, below its floor of 2 GiB (…)".
    fn below(&self, free: u64) -> String {
        let field = match self.default {
            true => "the default of sandbox.limits.diskFloorMiB: the larger of 2 GiB and 5 % of the filesystem; 0 turns it off",
            false => "sandbox.limits.diskFloorMiB",
        };
        format!(
            "the engine's filesystem ({}) has {} free, below its floor of {} ({field})",
            self.path.display(),
            size(free),
            size(self.bytes)
        )
    }
}

/// "312 MiB", "1.1 GiB".
pub fn size(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes.div_ceil(MIB))
    }
}

/// What one session's watch looks for.
#[derive(Debug, Clone, Default)]
pub struct WatchPlan {
    /// The session's directories on the engine's disk.
    pub roots: Vec<PathBuf>,
    /// `sandbox.limits.diskMiB`, bytes.
    pub bound: Option<u64>,
    pub floor: Option<Floor>,
}

/// One session's entry among those the floor chooses from.
struct Writer {
    id: u64,
    /// The floor's filesystem, by device (`None`: no floor).
    fs: Option<u64>,
    /// Bytes it added since its watch started.
    added: AtomicU64,
    /// Stopped for the floor; its directories are not gone yet.
    stopping: AtomicBool,
}

/// Every session's [`Writer`] in this process: the floor is the host's, whichever adapter's.
static WRITERS: Mutex<Vec<Arc<Writer>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Whether `me` is the one to stop for the floor now: no session on its filesystem is being
/// stopped for it already, and none added more (the earlier one of equals).
fn first_to_stop(me: &Writer) -> bool {
    let writers = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
    let same: Vec<&Arc<Writer>> = writers
        .iter()
        .filter(|w| w.fs.is_some() && w.fs == me.fs)
        .collect();
    if same.iter().any(|w| w.stopping.load(Ordering::SeqCst)) {
        return false;
    }
    let most = same
        .iter()
        .max_by_key(|w| (w.added.load(Ordering::SeqCst), std::cmp::Reverse(w.id)));
    if most.is_some_and(|w| w.id == me.id) {
        me.stopping.store(true, Ordering::SeqCst);
        return true;
    }
    false
}

/// A session's disk watch (module docs): a Tokio task, stopped when this is dropped, which
/// also takes the session out of the floor's choice. Drop it once the session's directories
/// are gone.
pub struct DiskWatch {
    task: tokio::task::JoinHandle<()>,
    writer: Arc<Writer>,
}

impl DiskWatch {
    /// Starts watching `plan` (in a Tokio runtime); `on_hit` gets the words of the first limit
    /// found, then the watch ends.
    pub fn start(plan: WatchPlan, on_hit: impl FnOnce(String) + Send + 'static) -> DiskWatch {
        let writer = Arc::new(Writer {
            id: NEXT_ID.fetch_add(1, Ordering::SeqCst),
            fs: plan
                .floor
                .as_ref()
                .and_then(|f| std::fs::metadata(&f.path).ok())
                .map(|m| id(&m).0),
            added: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        WRITERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(writer.clone());
        let task = tokio::spawn(watch(plan, writer.clone(), on_hit));
        DiskWatch { task, writer }
    }
}

impl Drop for DiskWatch {
    fn drop(&mut self) {
        self.task.abort();
        WRITERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|w| w.id != self.writer.id);
    }
}

/// A walk of `roots` off the async threads, and how long it took.
async fn walk(roots: &[PathBuf]) -> (Allocated, Duration) {
    let roots = roots.to_vec();
    let started = Instant::now();
    let found = tokio::task::spawn_blocking(move || allocated(&roots, MAX_ENTRIES))
        .await
        .unwrap_or_default();
    (found, started.elapsed())
}

/// The wait before the next look: half the time `headroom` bytes last at `rate` (bytes per
/// second, as last seen), between [`SOONEST`] and [`WATCH_EVERY`]: a session writing at
/// several GB/s toward its bound is looked at every few dozen milliseconds as it nears it, one
/// that writes little every quarter second.
fn paced(headroom: u64, rate: f64) -> Duration {
    if rate <= 0.0 {
        return WATCH_EVERY;
    }
    Duration::from_secs_f64(headroom as f64 / rate / 2.0).clamp(SOONEST, WATCH_EVERY)
}

/// Bytes per second from `before` to `now` over `secs`.
fn rate(before: u64, now: u64, secs: f64) -> f64 {
    (now as f64 - before as f64) / secs.max(1e-3)
}

/// One path per filesystem among `roots` (those that exist), whose free space [`nap`] watches.
fn one_per_filesystem(roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut devices = HashSet::new();
    roots
        .iter()
        .filter(|r| std::fs::symlink_metadata(r).is_ok_and(|m| devices.insert(id(&m).0)))
        .cloned()
        .collect()
}

/// The free space of `filesystems` together (`None` where one cannot be read).
fn free_on(filesystems: &[PathBuf]) -> Option<u64> {
    filesystems
        .iter()
        .try_fold(0u64, |sum, p| Some(sum.saturating_add(space(p)?.free)))
}

/// Sleeps `wait`, but looks at the free space of `filesystems` every [`SOONEST`] and wakes as
/// soon as it is down by more than `headroom` from `free_then`: whatever took it, the session
/// may have, so the walk that knows comes now, not at the walk's own pace (a writer at 2 GB/s
/// passes a 128 MiB bound by 400 MiB in a quarter second). A `statvfs` is one system call; the
/// walk it saves the waiting for is the costly part.
async fn nap(
    wait: Duration,
    filesystems: &[PathBuf],
    free_then: Option<u64>,
    headroom: Option<u64>,
) {
    let (Some(then), Some(headroom)) = (free_then, headroom) else {
        return tokio::time::sleep(wait).await;
    };
    let until = Instant::now() + wait;
    while Instant::now() < until {
        tokio::time::sleep(SOONEST.min(until - Instant::now())).await;
        if free_on(filesystems).is_some_and(|free| then.saturating_sub(free) > headroom) {
            return;
        }
    }
}

async fn watch(plan: WatchPlan, me: Arc<Writer>, on_hit: impl FnOnce(String)) {
    // Only a bound has a headroom for the free space to pass; a floor-only watch just sleeps.
    let filesystems = match plan.bound {
        Some(_) => one_per_filesystem(&plan.roots),
        None => Vec::new(),
    };
    let mut free_then = free_on(&filesystems);
    let (start, took) = walk(&plan.roots).await;
    let mut wait = WATCH_EVERY.max(took * WAIT_PER_WALK);
    let mut was_near = false;
    // The last look: when, what the session had added, what the filesystem had free.
    let mut last: (Instant, u64, Option<u64>) = (Instant::now(), 0, None);
    loop {
        let headroom = plan.bound.map(|b| b.saturating_sub(last.1));
        nap(wait, &filesystems, free_then, headroom).await;
        free_then = free_on(&filesystems);
        let below = plan
            .floor
            .as_ref()
            .and_then(|f| space(&f.path).map(|s| (f, s.free)));
        let near = below.is_some_and(|(f, free)| free < f.bytes.saturating_add(NEAR_FLOOR));
        let secs = last.0.elapsed().as_secs_f64();
        let mut next = WATCH_EVERY;
        let mut walked = Duration::ZERO;
        if plan.bound.is_some() || near {
            let (now, took) = walk(&plan.roots).await;
            walked = took;
            let added = now.bytes.saturating_sub(start.bytes);
            me.added.store(added, Ordering::SeqCst);
            if let Some(bound) = plan.bound {
                let bound_mib = bound / MIB;
                if !now.complete {
                    return on_hit(format!(
                        "the session's directories on disk could not all be measured (more than \
                         {MAX_ENTRIES} entries, or a directory it made unreadable), so \
                         sandbox.limits.diskMiB ({bound_mib} MiB) cannot be held"
                    ));
                }
                if added > bound {
                    return on_hit(format!(
                        "the session wrote {} on disk, past sandbox.limits.diskMiB ({bound_mib} MiB)",
                        size(added)
                    ));
                }
                next = next.min(paced(bound - added, rate(last.1, added, secs)));
            }
            last.1 = added;
        }
        if let (Some((floor, free)), Some(before)) = (below, last.2) {
            next = next.min(paced(
                free.saturating_sub(floor.bytes),
                rate(free, before, secs),
            ));
        }
        last = (Instant::now(), last.1, below.map(|(_, free)| free));
        wait = next.max(walked * WAIT_PER_WALK);
        let under = below.filter(|(f, free)| *free < f.bytes);
        // Chosen once the last look was near the floor already: the sessions on that
        // filesystem have measured what they added since they came near it.
        let settled = std::mem::replace(&mut was_near, near);
        if let Some((floor, free)) = under.filter(|_| settled) {
            if first_to_stop(&me) {
                return on_hit(format!(
                    "{}: of the sessions writing there, this one wrote the most ({}) and was stopped",
                    floor.below(free),
                    size(me.added.load(Ordering::SeqCst))
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: usize) {
        std::fs::write(path, vec![1u8; bytes]).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn links_are_counted_not_followed_and_a_file_with_two_names_once() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("big"), 4 << 20);
        std::fs::create_dir(t.path().join("d")).unwrap();
        write(&t.path().join("d/f"), 1 << 20);
        std::fs::hard_link(t.path().join("d/f"), t.path().join("d/g")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("dir-link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("big"), t.path().join("file-link")).unwrap();
        let a = allocated(&[t.path().to_path_buf()], MAX_ENTRIES);
        assert!(a.complete);
        // The root, d, f/g (one file), two links.
        assert_eq!(a.entries, 6);
        assert!(a.bytes >= 1 << 20 && a.bytes < 2 << 20, "{a:?}");
    }

    #[cfg(unix)]
    #[test]
    fn a_sparse_file_counts_the_blocks_it_holds_not_its_length() {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(t.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        let a = allocated(&[t.path().to_path_buf()], MAX_ENTRIES);
        assert!(a.bytes < 1 << 20, "{a:?}");
    }

    #[test]
    fn the_walk_is_bounded_in_entries_and_a_missing_root_holds_nothing() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..10 {
            write(&t.path().join(i.to_string()), 10);
        }
        let a = allocated(&[t.path().to_path_buf()], 5);
        assert_eq!((a.entries, a.complete), (5, false));
        let none = allocated(&[t.path().join("absent")], 5);
        assert_eq!(
            none,
            Allocated {
                complete: true,
                ..Allocated::default()
            }
        );
    }

    #[test]
    fn the_default_floor_is_the_larger_of_2_gib_and_5_percent() {
        assert_eq!(floor_bytes(DiskFloor::Default, 10 * GIB), Some(2 * GIB));
        assert_eq!(floor_bytes(DiskFloor::Default, 1000 * GIB), Some(50 * GIB));
        assert_eq!(floor_bytes(DiskFloor::Bytes(MIB), 1000 * GIB), Some(MIB));
        assert_eq!(floor_bytes(DiskFloor::Off, GIB), None);
        assert_eq!(size(312 * MIB), "312 MiB");
        assert_eq!(size(GIB + GIB / 10), "1.1 GiB");
    }

    #[test]
    fn the_faster_a_session_nears_its_limit_the_sooner_it_is_looked_at_again() {
        assert_eq!(paced(100 * MIB, 0.0), WATCH_EVERY);
        assert_eq!(paced(GIB, 1e6), WATCH_EVERY);
        // 100 MiB left at 1 GiB/s: half the ~98 ms it lasts.
        let d = paced(100 * MIB, GIB as f64);
        assert!(
            d > Duration::from_millis(45) && d < Duration::from_millis(55),
            "{d:?}"
        );
        assert_eq!(paced(0, GIB as f64), SOONEST);
    }

    #[cfg(unix)]
    #[test]
    fn a_filesystem_below_its_floor_refuses_naming_the_field() {
        let t = tempfile::tempdir().unwrap();
        let s = space(t.path()).unwrap();
        assert!(s.total >= s.free && s.total > 0);
        let err = Floor::check(t.path(), DiskFloor::Bytes(s.total)).unwrap_err();
        assert!(
            err.contains("below its floor of") && err.contains("(sandbox.limits.diskFloorMiB)"),
            "{err}"
        );
        assert!(Floor::check(t.path(), DiskFloor::Off).unwrap().is_none());
        assert!(Floor::check(t.path(), DiskFloor::Bytes(1))
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn past_its_bound_the_watch_calls_once_naming_the_limit_and_what_it_found() {
        let t = tempfile::tempdir().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let watch = DiskWatch::start(
            WatchPlan {
                roots: vec![t.path().to_path_buf()],
                bound: Some(MIB),
                floor: None,
            },
            move |m| {
                let _ = tx.send(m);
            },
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        write(&t.path().join("f"), 3 << 20);
        let said = tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            said,
            "the session wrote 3 MiB on disk, past sandbox.limits.diskMiB (1 MiB)"
        );
        drop(watch);
    }

    #[tokio::test]
    async fn a_filesystem_losing_more_than_the_headroom_wakes_the_watch_before_its_wait() {
        let t = tempfile::tempdir().unwrap();
        let filesystems = one_per_filesystem(&[t.path().to_path_buf(), t.path().join("gone")]);
        assert_eq!(filesystems, vec![t.path().to_path_buf()]);
        let then = free_on(&filesystems);
        let dir = t.path().to_path_buf();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut f = std::fs::File::create(dir.join("f")).unwrap();
            std::io::Write::write_all(&mut f, &vec![1u8; 16 << 20]).unwrap();
            f.sync_all().unwrap();
        });
        let started = Instant::now();
        nap(Duration::from_secs(30), &filesystems, then, Some(MIB)).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        writer.join().unwrap();
    }

    #[tokio::test]
    async fn below_the_floor_the_session_that_wrote_most_is_stopped_first_and_alone() {
        let t = tempfile::tempdir().unwrap();
        let total = space(t.path()).unwrap().total;
        let floor = Floor {
            path: t.path().to_path_buf(),
            bytes: total,
            default: false,
        };
        let (small, big) = (t.path().join("small"), t.path().join("big"));
        std::fs::create_dir(&small).unwrap();
        std::fs::create_dir(&big).unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let start = |dir: &Path, name: &'static str| {
            let hits = hits.clone();
            DiskWatch::start(
                WatchPlan {
                    roots: vec![dir.to_path_buf()],
                    bound: None,
                    floor: Some(floor.clone()),
                },
                move |m| hits.lock().unwrap().push((name, m)),
            )
        };
        let watches = [start(&small, "small"), start(&big, "big")];
        // Written after the watches' first walk, which is what they count from.
        tokio::time::sleep(Duration::from_millis(100)).await;
        write(&small.join("f"), 1 << 20);
        write(&big.join("f"), 2 << 20);
        tokio::time::sleep(WATCH_EVERY * 4).await;
        let said = hits.lock().unwrap().clone();
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(said[0].0, "big");
        assert!(
            said[0].1.contains("below its floor of")
                && said[0].1.contains("this one wrote the most (2 MiB)"),
            "{said:?}"
        );
        drop(watches);
    }
}
