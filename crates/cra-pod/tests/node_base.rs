//! `cra-pod base` and `cra-pod layer` (the checkout's base kept once per node) run as the pod
//! runs them, on a scratch directory standing in for the node's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, SystemTime};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_cra-pod");

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cra-pod-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One `cra-pod base` process: its stdin (held open: it holds the base) and its lines.
struct Base {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
}

impl Base {
    fn start(bases: &Path, key: &str, name: &str) -> Base {
        let mut child = Command::new(BIN)
            .args(["base", bases.to_str().unwrap(), key, name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Base { child, stdin, out }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim().to_string()
    }

    fn publish(&mut self, snapshot: &str) -> String {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "publish {snapshot}").unwrap();
        stdin.flush().unwrap();
        self.line()
    }

    /// Ends it as the pod's end does (its stdin closes); waits for it.
    fn end(mut self) {
        self.stdin = None;
        self.child.wait().unwrap();
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn age(path: &Path, by: Duration) {
    let f = std::fs::File::open(path).unwrap();
    f.set_modified(SystemTime::now() - by).unwrap();
}

#[test]
fn the_first_maker_publishes_and_a_racing_maker_takes_its_base_and_removes_its_own() {
    let bases = scratch("race");
    let mut a = Base::start(&bases, "0a", ".b-aa");
    let mut b = Base::start(&bases, "0a", ".b-bb");
    assert_eq!(a.line(), "miss .b-aa");
    assert_eq!(b.line(), "miss .b-bb");
    std::fs::write(bases.join(".b-aa/tree/f"), "a").unwrap();
    std::fs::write(bases.join(".b-bb/tree/f"), "b").unwrap();
    let tree_a = bases.join(".b-aa/tree");
    assert_eq!(
        a.publish("c1 100"),
        format!("hit {} c1 100", tree_a.display())
    );
    // B's own base is as good, but A's came first: B uses A's, and its own is gone.
    assert_eq!(
        b.publish("c2 200"),
        format!("hit {} c1 100", tree_a.display())
    );
    assert_eq!(names(&bases), vec![".b-aa", "0a"]);
    // A later pod finds it at once.
    let mut c = Base::start(&bases, "0a", ".b-cc");
    assert_eq!(c.line(), format!("hit {} c1 100", tree_a.display()));
    assert!(!bases.join(".b-cc").exists());
    for p in [a, b, c] {
        p.end();
    }
    let _ = std::fs::remove_dir_all(&bases);
}

#[test]
fn a_maker_that_ends_before_publishing_leaves_nothing() {
    let bases = scratch("abandoned");
    let mut a = Base::start(&bases, "0b", ".b-aa");
    assert_eq!(a.line(), "miss .b-aa");
    std::fs::write(bases.join(".b-aa/tree/f"), "half").unwrap();
    a.end();
    assert!(names(&bases).is_empty(), "{:?}", names(&bases));
    let _ = std::fs::remove_dir_all(&bases);
}

#[test]
fn a_new_base_evicts_the_unused_ones_no_pod_holds_and_never_one_a_pod_holds() {
    let bases = scratch("evict");
    let publish = |key: &str, name: &str| {
        let mut p = Base::start(&bases, key, name);
        assert_eq!(p.line(), format!("miss {name}"));
        // A setup's read-only directory: removed all the same.
        let ro = bases.join(name).join("tree/cache");
        std::fs::create_dir_all(ro.join("d")).unwrap();
        std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
        assert!(p.publish("c 1").starts_with("hit "));
        p
    };
    let held = publish("01", ".b-01");
    let released = publish("02", ".b-02");
    released.end();
    let recent = publish("03", ".b-03");
    recent.end();
    // Two hours unused: the held one and the released one; the third was used just now.
    age(&bases.join(".b-01/lock"), Duration::from_secs(7200));
    age(&bases.join(".b-02/lock"), Duration::from_secs(7200));
    // A maker's directory long abandoned (no publish, no holder).
    std::fs::create_dir_all(bases.join(".b-99/tree")).unwrap();
    std::fs::File::create(bases.join(".b-99/lock")).unwrap();
    age(&bases.join(".b-99"), Duration::from_secs(7200));
    let newest = publish("04", ".b-04");
    assert_eq!(
        names(&bases),
        vec![".b-01", ".b-03", ".b-04", "01", "03", "04"]
    );
    for p in [held, newest] {
        p.end();
    }
    let _ = std::fs::remove_dir_all(&bases);
}

#[test]
fn a_base_being_removed_is_not_taken() {
    let bases = scratch("unlinked");
    let mut a = Base::start(&bases, "0c", ".b-aa");
    assert_eq!(a.line(), "miss .b-aa");
    a.publish("c 1");
    a.end();
    // What an eviction does first: the key unlinked, the directory still there.
    std::fs::remove_file(bases.join("0c")).unwrap();
    let mut b = Base::start(&bases, "0c", ".b-bb");
    assert_eq!(b.line(), "miss .b-bb");
    b.end();
    let _ = std::fs::remove_dir_all(&bases);
}

#[test]
fn keys_and_names_not_the_adapters_are_refused() {
    let bases = scratch("refused");
    for (key, name) in [
        ("../x", ".b-aa"),
        ("0a", "tree"),
        ("0a", ".b-../x"),
        ("", ".b-aa"),
    ] {
        let out = Command::new(BIN)
            .args(["base", bases.to_str().unwrap(), key, name])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{key} {name}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("is not this adapter's"));
    }
    assert!(names(&bases).is_empty());
    let _ = std::fs::remove_dir_all(&bases);
}

/// A scratch directory with a base (`lower/kept`), an empty layer and a target, and the layer
/// file naming them as an overlay: (the directory, the file, its text).
fn overlay_layer(name: &str) -> (PathBuf, PathBuf, String) {
    let dir = scratch(name);
    let (file, text) = common::overlay_file(&dir);
    std::fs::write(dir.join("lower/kept"), "base\n").unwrap();
    (dir, file, text)
}

#[test]
fn layer_shows_the_base_under_the_sessions_own_layer_and_writes_only_the_layer() {
    let (dir, file, _) = overlay_layer("layer");
    std::fs::write(dir.join("lower/gone"), "base\n").unwrap();
    let p = |d: &str| dir.join(d).display().to_string();
    let t = p("target");
    let (_, out) = layered(
        &file,
        &format!(
            "cat {t}/kept && echo new > {t}/new && rm {t}/gone && echo more >> {t}/kept && ls {t}"
        ),
    );
    assert_eq!(out, "base\nkept\nnew\n");
    // The base is untouched; the layer has the writes; the target is empty outside.
    assert_eq!(names(&dir.join("lower")), vec!["gone", "kept"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("lower/kept")).unwrap(),
        "base\n"
    );
    assert_eq!(names(&dir.join("upper")), vec!["gone", "kept", "new"]);
    assert!(names(&dir.join("target")).is_empty());
    // Bound without an upper layer: the base itself, writable (a base's setup).
    std::fs::write(&file, format!("lower={}\ntarget={t}\n", p("lower"))).unwrap();
    let out = Command::new(BIN)
        .args(["layer", file.to_str().unwrap(), "--", "sh", "-c"])
        .arg(format!("echo setup > {t}/made && ls {t}"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "gone\nkept\nmade\n");
    assert!(dir.join("lower/made").exists());
    // A file naming half an overlay is refused in the jail's words, before anything runs.
    std::fs::write(
        &file,
        format!("lower={}\nupper=x\ntarget={t}\n", p("lower")),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args([
            "layer",
            file.to_str().unwrap(),
            "--",
            "touch",
            &format!("{t}/ran"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("cra-jail: the checkout's layer cannot be mounted"));
    assert!(!dir.join("lower/ran").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unpublish_takes_a_held_base_off_the_list_and_it_stays_for_those_holding_it() {
    let bases = scratch("unpublish");
    let mut a = Base::start(&bases, "0d", ".b-aa");
    assert_eq!(a.line(), "miss .b-aa");
    a.publish("c 1 image-1");
    let mut b = Base::start(&bases, "0d", ".b-bb");
    assert!(b.line().ends_with("c 1 image-1"));
    // B's pod runs another image under the same name: it takes the base off the list.
    writeln!(b.stdin.as_mut().unwrap(), "unpublish").unwrap();
    b.end();
    assert_eq!(names(&bases), vec![".b-aa"]);
    assert!(bases.join(".b-aa/tree").exists());
    // The next pod of that name makes a new one.
    let mut c = Base::start(&bases, "0d", ".b-cc");
    assert_eq!(c.line(), "miss .b-cc");
    assert!(c.publish("c 2 image-2").ends_with("c 2 image-2"));
    for p in [a, c] {
        p.end();
    }
    let _ = std::fs::remove_dir_all(&bases);
}

/// The namespace `cra-pod layer FILE -- CMD` ran CMD in (`/proc/self/ns/mnt`), and what CMD
/// printed of the target.
fn layered(file: &Path, script: &str) -> (String, String) {
    let out = Command::new(BIN)
        .args(["layer", file.to_str().unwrap(), "--", "sh", "-c"])
        .arg(format!("readlink /proc/self/ns/mnt; {script}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).unwrap();
    let (ns, rest) = out.split_once('\n').unwrap();
    (ns.to_string(), rest.to_string())
}

#[test]
fn a_held_layer_is_one_mount_every_later_command_joins_and_a_stale_holder_is_not_joined() {
    let (dir, file, text) = overlay_layer("hold");
    let t = dir.join("target").display().to_string();
    let mut holder = Command::new(BIN)
        .args(["layer", file.to_str().unwrap(), "--hold"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "held\n");
    let held_ns = std::fs::read_link(format!("/proc/{}/ns/mnt", holder.id()))
        .unwrap()
        .display()
        .to_string();
    // Two commands, one after the other: both in the holder's namespace, the second sees
    // what the first wrote, and the writes are in the layer.
    let (ns1, _) = layered(&file, &format!("echo new > {t}/new"));
    assert_eq!(ns1, held_ns);
    let (ns2, seen) = layered(&file, &format!("cat {t}/new; ls {t}"));
    assert_eq!(ns2, held_ns);
    assert_eq!(seen, "new\nkept\nnew\n");
    assert!(dir.join("upper/new").exists());
    assert!(!dir.join("lower/new").exists());
    assert!(names(&dir.join("target")).is_empty());
    // A layer file that changed since (another checkout): not joined, its own mount.
    let other = format!("{text}\n");
    std::fs::write(&file, &other).unwrap();
    let (ns3, seen) = layered(&file, &format!("ls {t}"));
    assert_ne!(ns3, held_ns);
    assert_eq!(seen, "kept\nnew\n");
    std::fs::write(&file, &text).unwrap();
    // A record whose process is not the holder any more (its start time differs): not joined.
    let record = dir.join("layer.holder");
    let real = std::fs::read_to_string(&record).unwrap();
    let (head, rest) = real.split_once('\n').unwrap();
    let (pid, started) = head.split_once(' ').unwrap();
    let stale = format!("{pid} {}\n{rest}", started.parse::<u64>().unwrap() + 1);
    std::fs::write(&record, stale).unwrap();
    let (ns4, _) = layered(&file, &format!("ls {t}"));
    assert_ne!(ns4, held_ns);
    std::fs::write(&record, &real).unwrap();
    // The holder ends with its stdin, and takes its record with it.
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    assert!(!record.exists());
    // Its namespace is gone with it, and the kernel hands a freed namespace's number to the
    // next one made, so the number proves nothing here: the command runs in a mount of its
    // own, which it must, there being no holder to join, and sees the layer.
    let (_, seen) = layered(&file, &format!("ls {t}"));
    assert_eq!(seen, "kept\nnew\n");
    let _ = std::fs::remove_dir_all(&dir);
}
