//! A checkout's base kept once per node (`backend.kubernetes.nodeCache`), and each session's
//! copy-on-write layer over it.
//!
//! - `cra-pod layer FILE -- CMD...`: CMD in a user and mount namespace of its own where the
//!   checkout FILE describes is mounted: `lower=` (the base's tree) bound at `target=`, or with
//!   `upper=` and `work=` an overlay of them on it. `cra-jail` runs itself through this, so the
//!   jail's bubblewrap sees the checkout at its usual place and nothing of the node's bases:
//!   the mount exists only in that namespace, for as long as its processes.
//! - `cra-pod base BASES KEY NAME`: the base KEY in the node's directory BASES. If it is
//!   there, prints `hit DIR RECORD` (its directory and its record) and holds it until
//!   stdin ends. Otherwise makes `BASES/NAME/tree` for this pod to check out into, prints
//!   `miss NAME`, and waits for `publish RECORD` on stdin (the snapshot and the image it was
//!   made in, which this program only keeps and says back): then the base is published as
//!   KEY (or, if another pod published KEY first, that one is taken and NAME removed), bases no
//!   pod holds and unused for an hour are removed, and it prints `hit …` and holds as above.
//!   Stdin ending before `publish` removes NAME.
//!
//! Once held, `unpublish` on stdin unlinks KEY if it still names the held base.
//!
//! Holding is a shared `flock` on the base's `lock` file, for as long as this process lives:
//! the pod's stream ends it, and so does the pod's end. A base is removed only under an
//! exclusive lock, which no holder allows: a base is never removed below a session using it.

use std::ffi::CString;
use std::io::{BufRead, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A base unused for this long, and held by no pod, is removed when another is made.
const UNUSED: Duration = Duration::from_secs(3600);
/// A base directory younger than this is never taken for an abandoned one (its maker may not
/// hold its lock yet).
const YOUNG: Duration = Duration::from_secs(600);

/// `cra-pod layer FILE -- CMD...` (module docs). Exits 125 with one line on stderr, in
/// `cra-jail`'s words, when the checkout cannot be mounted.
pub fn layer(args: &[String]) -> ! {
    let (file, cmd) = match args {
        [file, dash, cmd @ ..] if dash == "--" && !cmd.is_empty() => (file, Some(cmd)),
        [file, hold] if hold == "--hold" => (file, None),
        _ => layer_failed("usage: cra-pod layer FILE (-- CMD... | --hold)".into()),
    };
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| layer_failed(format!("{file}: {e}")));
    let holder = PathBuf::from(format!("{file}.holder"));
    if let Some(cmd) = cmd {
        if join_holder(&holder, &text) {
            run(cmd)
        }
    }
    let get = |key: &str| layer_field(&text, key).map(str::to_string);
    let (Some(lower), Some(target)) = (get("lower"), get("target")) else {
        layer_failed(format!("{file} names no lower= or no target="))
    };
    let overlay = match (get("upper"), get("work")) {
        (Some(upper), Some(work)) => Some((upper, work)),
        (None, None) => None,
        _ => layer_failed(format!(
            "{file} names one of upper= and work= without the other"
        )),
    };
    if let Err(e) = mount_in_namespace(&lower, overlay, &target) {
        layer_failed(e)
    }
    match cmd {
        Some(cmd) => run(cmd),
        None => hold_layer(&holder, &text),
    }
}

/// The value of `key=` in a layer file's `text` (`lower`, `upper`, `work`, `target`).
pub fn layer_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// Exits 125 with one line on stderr, in `cra-jail`'s words.
fn layer_failed(what: String) -> ! {
    eprintln!("cra-jail: the checkout's layer cannot be mounted: {what}");
    std::process::exit(125)
}

/// Execs `cmd` in the checkout's namespace.
fn run(cmd: &[String]) -> ! {
    let e = std::process::Command::new(&cmd[0]).args(&cmd[1..]).exec();
    layer_failed(format!("cannot run {}: {e}", cmd[0]))
}

/// `cra-pod layer FILE --hold`: keeps the checkout's namespace, its mount made, for as long as
/// stdin is open, and says where in `HOLDER` (`PID STARTTIME`, then FILE's text), written once
/// the mount is there; prints `held` then. Every later `cra-pod layer FILE -- CMD` of the pod
/// joins it ([`join_holder`]) rather than mounting the overlay again: one overlay for the
/// whole session, whose dentries the agent's walks of the tree (its CLI's `git status`) warm
/// for the extraction, where a fresh mount's first walk of 100,000 paths took ~1 s (and one
/// upper directory is meant for one mount at a time: overlayfs leaves two undefined).
fn hold_layer(holder: &Path, text: &str) -> ! {
    let me = std::process::id();
    let Some(started) = start_time(me) else {
        layer_failed("cannot read this process's start time".into())
    };
    let temp = holder.with_extension("holder.tmp");
    let record = format!("{me} {started}\n{text}");
    if let Err(e) = std::fs::write(&temp, record).and_then(|_| std::fs::rename(&temp, holder)) {
        layer_failed(format!("cannot write {}: {e}", holder.display()))
    }
    println!("held");
    let _ = std::io::stdout().flush();
    // Until the engine's end of stdin closes (the session's end, or the pod's stream's).
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    let _ = std::fs::remove_file(holder);
    std::process::exit(0)
}

/// Joins the namespaces of the holder `HOLDER` names ([`hold_layer`]), when it is still that
/// process (its start time) and holds the checkout FILE's `text` describes now; false (this
/// process unchanged) otherwise, and the caller mounts its own. Its cwd is then re-resolved
/// by path inside, as after a mount of its own.
fn join_holder(holder: &Path, text: &str) -> bool {
    let Ok(record) = std::fs::read_to_string(holder) else {
        return false;
    };
    let Some((head, held)) = record.split_once('\n') else {
        return false;
    };
    let Some((pid, started)) = head.split_once(' ') else {
        return false;
    };
    let (Ok(pid), Ok(started)) = (pid.parse::<u32>(), started.parse::<u64>()) else {
        return false;
    };
    if held != text || start_time(pid) != Some(started) {
        return false;
    }
    let open = |ns: &str| std::fs::File::open(format!("/proc/{pid}/ns/{ns}")).ok();
    let (Some(user), Some(mnt)) = (open("user"), open("mnt")) else {
        return false;
    };
    // Opened from the holder itself: the same start time after the opens means the pid was
    // not reused in between.
    if start_time(pid) != Some(started) {
        return false;
    }
    let cwd = std::env::current_dir().ok();
    // SAFETY: setns on file descriptors this function owns; the process has one thread.
    let joined = unsafe {
        libc::setns(user.as_raw_fd(), libc::CLONE_NEWUSER) == 0
            && libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) == 0
    };
    if !joined {
        // Joining the user namespace alone changes nothing the mount below needs: a failed
        // mount namespace join leaves this process where it mounts its own (nested) one.
        return false;
    }
    if let Some(cwd) = cwd {
        let _ = std::env::set_current_dir(cwd);
    }
    true
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks since boot).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name, which may hold spaces and parentheses: the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// Makes a user namespace mapping only this process's uid and gid to themselves (so the
/// command keeps them and no privilege is needed) and a mount namespace, and mounts the
/// checkout there. This process is single-threaded, as `unshare(CLONE_NEWUSER)` requires.
fn mount_in_namespace(
    lower: &str,
    overlay: Option<(String, String)>,
    target: &str,
) -> Result<(), String> {
    let c = |s: &str| CString::new(s).map_err(|e| e.to_string());
    let data = match &overlay {
        Some((upper, work)) => {
            for p in [lower, upper.as_str(), work.as_str()] {
                if p.bytes().any(|b| b",:\\".contains(&b)) {
                    return Err(format!(
                        "{p} has a character overlayfs options cannot carry"
                    ));
                }
            }
            // `userxattr`: its markers as user.* xattrs, which a user namespace may set.
            Some(c(&format!(
                "lowerdir={lower},upperdir={upper},workdir={work},userxattr"
            ))?)
        }
        None => None,
    };
    let (lower_c, target_c) = (c(lower)?, c(target)?);
    // SAFETY: plain system calls.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: unshare touches no memory; this process has one thread.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        return Err(format!(
            "unshare: {} (user namespaces refused?)",
            std::io::Error::last_os_error()
        ));
    }
    // Without "deny" an unprivileged process may not write its gid_map.
    let _ = std::fs::write("/proc/self/setgroups", "deny");
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))
        .map_err(|e| format!("uid_map: {e}"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
        .map_err(|e| format!("gid_map: {e}"))?;
    // Nothing mounted here may pass back to the pod's namespace.
    mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("private /: {e}"))?;
    match &data {
        Some(data) => mount(Some(c"overlay"), &target_c, Some(c"overlay"), 0, Some(data)),
        None => mount(
            Some(&lower_c),
            &target_c,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        ),
    }
    .map_err(|e| {
        let how = if data.is_some() { "overlay" } else { "bind" };
        format!("{how} mount of {lower} at {target}: {e}")
    })
}

/// mount(2), its absent arguments null.
fn mount(
    source: Option<&std::ffi::CStr>,
    target: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    let ptr = |s: Option<&std::ffi::CStr>| s.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `cra-pod base BASES KEY NAME` (module docs).
pub fn base(args: &[String]) -> ! {
    let fail = |what: String| -> ! {
        eprintln!("cra-pod base: {what}");
        std::process::exit(1)
    };
    let [bases, key, name] = args else {
        fail("usage: cra-pod base BASES KEY NAME".into())
    };
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(key) || !name.strip_prefix(".b-").is_some_and(hex) {
        fail(format!(
            "KEY {key:?} or NAME {name:?} is not this adapter's"
        ));
    }
    let bases = PathBuf::from(bases);
    if let Err(e) = std::fs::create_dir_all(&bases) {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        fail(format!(
            "the node cache is not writable by uid {uid}: cannot make {}: {e}",
            bases.display()
        ))
    }
    let mut out = std::io::stdout();
    if let Some(held) = take(&bases, key) {
        let _ = writeln!(out, "hit {}", held.line);
        let _ = out.flush();
        hold(&bases, key, held)
    }
    let dir = bases.join(name);
    let lock = std::fs::create_dir_all(dir.join("tree"))
        .and_then(|_| open_lock(&dir))
        .and_then(|f| flock(&f, libc::LOCK_SH | libc::LOCK_NB).map(|_| f))
        .unwrap_or_else(|e| fail(format!("cannot make {}: {e}", dir.display())));
    let _ = writeln!(out, "miss {name}");
    let _ = out.flush();
    let mut line = String::new();
    let publish = std::io::stdin().lock().read_line(&mut line).ok();
    let snapshot = line.strip_prefix("publish ").map(str::trim).filter(|s| {
        publish.is_some_and(|n| n > 0) && !s.is_empty() && !s.contains(char::is_control)
    });
    let Some(snapshot) = snapshot else {
        drop(lock);
        let _ = remove_tree(&dir);
        std::process::exit(0)
    };
    if let Err(e) = std::fs::write(dir.join("snapshot"), format!("{snapshot}\n")) {
        drop(lock);
        let _ = remove_tree(&dir);
        fail(format!("cannot write the snapshot: {e}"))
    }
    let held = match std::os::unix::fs::symlink(name, bases.join(key)) {
        Ok(()) => Held {
            line: format!("{} {snapshot}", dir.join("tree").display()),
            name: PathBuf::from(name),
            lock,
        },
        // Another pod's base came first: it is as good as this one, which nobody uses yet.
        Err(_) => match take(&bases, key) {
            Some(theirs) => {
                drop(lock);
                let _ = remove_tree(&dir);
                theirs
            }
            None => fail(format!("{key} could be neither published nor taken")),
        },
    };
    evict(&bases);
    let _ = writeln!(out, "hit {}", held.line);
    let _ = out.flush();
    hold(&bases, key, held)
}

/// A base this process holds: its `hit` line's words after `hit`, its directory's name, and
/// the held lock.
struct Held {
    line: String,
    name: PathBuf,
    lock: std::fs::File,
}

/// The published base KEY, held, or None (there is none, or it is being removed).
fn take(bases: &Path, key: &str) -> Option<Held> {
    let name = std::fs::read_link(bases.join(key)).ok()?;
    let dir = bases.join(&name);
    let lock = open_lock(&dir).ok()?;
    // An eviction holds it exclusively only while it removes the base: wait that out.
    let deadline = SystemTime::now() + Duration::from_secs(60);
    while flock(&lock, libc::LOCK_SH | libc::LOCK_NB).is_err() {
        if SystemTime::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Still the published one (an eviction unlinks it before removing it).
    if std::fs::read_link(bases.join(key)).ok()? != name {
        return None;
    }
    let snapshot = std::fs::read_to_string(dir.join("snapshot")).ok()?;
    // Its use, for eviction's "unused for an hour".
    let _ = lock.set_modified(SystemTime::now());
    Some(Held {
        line: format!("{} {}", dir.join("tree").display(), snapshot.trim()),
        name,
        lock,
    })
}

fn open_lock(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
}

fn flock(f: &std::fs::File, how: i32) -> std::io::Result<()> {
    // SAFETY: flock on an open descriptor.
    match unsafe { libc::flock(f.as_raw_fd(), how) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Holds the base until stdin ends. `unpublish` on stdin (the engine found the base made in
/// another image than its pod's: a tag that moved) unlinks KEY if it still names this base,
/// so that the next pod makes a new one; this pod and others holding it keep it until they
/// end, and eviction then removes it as an abandoned one.
fn hold(bases: &Path, key: &str, held: Held) -> ! {
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim() == "unpublish"
            && std::fs::read_link(bases.join(key)).is_ok_and(|to| to == held.name)
        {
            let _ = std::fs::remove_file(bases.join(key));
        }
    }
    drop(held.lock);
    std::process::exit(0)
}

/// Removes, of the node's bases, those no pod holds: published ones unused for [`UNUSED`]
/// (unlinked first, so no pod takes one being removed) and unpublished ones older than
/// [`YOUNG`] (their maker is gone: it holds its lock from the start).
fn evict(bases: &Path) {
    let Ok(entries) = std::fs::read_dir(bases) else {
        return;
    };
    let mut published = Vec::new();
    let mut dirs = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        match std::fs::read_link(e.path()) {
            Ok(to) => published.push((name, to)),
            Err(_) if name.starts_with(".b-") => dirs.push(name),
            Err(_) => {}
        }
    }
    let age = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or_default()
    };
    for (key, to) in &published {
        let dir = bases.join(to);
        let Ok(lock) = open_lock(&dir) else { continue };
        if age(&dir.join("lock")) < UNUSED || flock(&lock, libc::LOCK_EX | libc::LOCK_NB).is_err() {
            continue;
        }
        if std::fs::remove_file(bases.join(key)).is_ok() {
            let _ = remove_tree(&dir);
        }
    }
    for name in dirs {
        let dir = bases.join(&name);
        if published
            .iter()
            .any(|(_, to)| to.as_os_str() == name.as_str())
            || age(&dir) < YOUNG
        {
            continue;
        }
        let Ok(lock) = open_lock(&dir) else { continue };
        if flock(&lock, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let _ = remove_tree(&dir);
        }
    }
}

/// Removes a tree a setup may have made unremovable (a read-only module cache): on failure
/// every directory gets its owner's permissions back and the removal is tried again.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    if std::fs::remove_dir_all(dir).is_ok() {
        return Ok(());
    }
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        if let Ok(path) = CString::new(d.as_os_str().as_bytes()) {
            let mode = meta.permissions().mode() | 0o700;
            // SAFETY: a path that outlives the call; no link is followed.
            unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), mode & 0o7777, 0) };
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            todo.extend(entries.flatten().map(|e| e.path()));
        }
    }
    std::fs::remove_dir_all(dir)
}
