//! The end of a session on a node's base reads only what its layer changed (`cra-pod
//! candidates`, `receive`, `pathspecs`): run with the engine's own extraction script (read from
//! its source, so this runs the script the pod runs) on real overlays, each case's final tree
//! must be the one the whole checkout's staging gives on the same layer, byte for byte, and the
//! cases a limited staging handles must take it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_cra-pod");
const WORK_RS: &str = include_str!("../../../src/environment/kubernetes/work.rs");

/// A raw string constant of the engine's `work.rs`, as the pod is given it.
fn engine_script(name: &str) -> String {
    let start = format!("pub(super) const {name}: &str =");
    let from = WORK_RS.find(&start).unwrap() + start.len();
    let rest = &WORK_RS[from..];
    let open = rest.find("r#\"").unwrap() + 3;
    let close = rest[open..].find("\"#").unwrap();
    rest[open..open + close].to_string()
}

/// The neutral git of the pod's scripts (`$G`), as far as a test repository needs it.
const G: &str = "git -c core.fsmonitor=false -c core.hooksPath=/dev/null";
const C: &str = "GIT_AUTHOR_NAME=cra GIT_AUTHOR_EMAIL=cra@localhost GIT_COMMITTER_NAME=cra \
    GIT_COMMITTER_EMAIL=cra@localhost GIT_AUTHOR_DATE='@0 +0000' GIT_COMMITTER_DATE='@0 +0000'";

struct Layer {
    dir: PathBuf,
    file: PathBuf,
    target: String,
    base: String,
}

impl Drop for Layer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A base checked out now (its files of this second: racily clean in the index, as a node's
/// base made just before its first session), or `aged` (every file and the index older than
/// the trust limit), with an empty layer over it.
fn layer(name: &str, aged: bool) -> Layer {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cra-cand-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (file, _) = common::overlay_file(&dir);
    let lower = dir.join("lower");
    sh(
        &lower,
        "git init -q && mkdir -p src lib/deep vendor && printf 'a\\n' > src/a.txt && \
         printf 'x = 42\\n' > src/b.txt && printf 'c\\n' > lib/c.txt && printf 'd\\n' > lib/deep/d && \
         : > empty && printf 'kept\\n' > vendor/keep.txt && printf '*.log\\nvendor/\\ntarget/\\n' > .gitignore && \
         git add -A && git add -f vendor/keep.txt && \
         git -c user.name=t -c user.email=t@t commit -qm base && git rev-parse HEAD",
    );
    if aged {
        sh(
            &lower,
            "find . -path ./.git -prune -o -exec touch -h -d '-1 hour' {} + && \
             git update-index -q --really-refresh && touch -d '-30 minutes' .git/index",
        );
    }
    let base = sh(&lower, "git rev-parse HEAD");
    Layer {
        target: dir.join("target").display().to_string(),
        dir,
        file,
        base,
    }
}

impl Layer {
    /// `script` in the checkout, in the layer's namespace; its stdout and stderr.
    fn run(&self, script: &str, env: &[(&str, &str)], stdin: Option<Vec<u8>>) -> (String, String) {
        let mut cmd = Command::new(BIN);
        cmd.args(["layer", self.file.to_str().unwrap(), "--", "sh", "-c"])
            .arg(format!("cd {} && {script}", self.target))
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            std::io::Write::write_all(&mut { input }, &bytes).unwrap();
        } else {
            drop(input);
        }
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{script}: {said}");
        (
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            said,
        )
    }

    /// The engine's extraction (`layered`: the candidates piped in, as the pod runs it); the
    /// final tree, and what it said.
    fn extract(&self, trust: u64, layered: bool) -> (String, String) {
        let script = engine_script("EXTRACT_SCRIPT");
        let mut said = String::new();
        let mut env = vec![("G", G), ("C", C)];
        let input = layered.then(|| {
            let out = Command::new(BIN)
                .args([
                    "candidates",
                    self.file.to_str().unwrap(),
                    &trust.to_string(),
                ])
                .output()
                .unwrap();
            said.push_str(&String::from_utf8_lossy(&out.stderr));
            out.stdout
        });
        if layered {
            env.push(("P", BIN));
        }
        // The jail gives each extraction a /tmp of its own; here the host's is shared, so what
        // an earlier one left there goes first (the cases run one at a time: `ONE_AT_A_TIME`).
        let run = format!(
            "rm -rf /tmp/cra-c /tmp/cra-final.index /tmp/cra-final.index.lock && \
             sh -c \"$X\" sh {base} {base} {trust} >/dev/null && {G} rev-parse 'refs/cra/final^{{tree}}'",
            base = self.base
        );
        let x = script.clone();
        env.push(("X", &x));
        let (tree, more) = self.run(&run, &env, input);
        said.push_str(&more);
        (tree, said)
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// name → the agent's commands in its checkout, and whether a limited staging handles it.
const CASES: &[(&str, &str, bool)] = &[
    ("nothing", "true", true),
    ("an appended line", "echo more >> src/a.txt", true),
    ("a same-size edit", "printf 'x = 43\\n' > src/b.txt", true),
    (
        "a same-size edit back-dated",
        "m=$(stat -c %Y src/b.txt) && printf 'x = 43\\n' > src/b.txt && touch -m -d @$m src/b.txt",
        true,
    ),
    ("a deleted file", "rm src/a.txt", true),
    ("a deleted directory", "rm -r lib", true),
    (
        "a directory made anew",
        "rm -r lib && mkdir lib && echo new > lib/c.txt",
        true,
    ),
    (
        "a new directory",
        "mkdir -p new/sub && echo n > new/sub/f",
        true,
    ),
    (
        "a new ignored file and a new one",
        "echo x > build.log && echo y > notes.txt",
        true,
    ),
    (
        "a new file in an ignored directory",
        "mkdir -p target && echo t > target/out",
        true,
    ),
    (
        "an ignored directory's tracked file deleted",
        "rm -r vendor",
        true,
    ),
    (
        "a staged edit edited again",
        "echo z >> src/a.txt && git add src/a.txt && echo w >> src/a.txt",
        true,
    ),
    (
        "an entry removed from the index",
        "git rm -q --cached src/b.txt",
        true,
    ),
    ("a mode change", "chmod +x src/a.txt", true),
    ("a symlink", "ln -s src/a.txt link", true),
    (
        "a file become a directory",
        "rm src/b.txt && mkdir src/b.txt && echo in > src/b.txt/f",
        true,
    ),
    (
        "a commit",
        "echo c >> lib/deep/d && git add -A && git -c user.name=a -c user.email=a@a commit -qm w",
        true,
    ),
    ("an empty file written", "echo e > empty", true),
    // What the pod's history on demand leaves in the git dir (image/git-history).
    (
        "the history marker's error kept",
        "echo fetched > .git/cra-history.err && echo more >> src/a.txt",
        true,
    ),
    // Rules that reach beyond their path, and marks git obeys whatever the file holds.
    (
        "a .gitignore edited",
        "echo '*.txt' >> .gitignore && echo n > new.txt",
        false,
    ),
    (
        "an assume-unchanged file rewritten",
        "git update-index --assume-unchanged src/b.txt && printf 'x = 43\\n' > src/b.txt",
        false,
    ),
    (
        "an exclude rule added",
        "echo 'notes.txt' >> .git/info/exclude && echo y > notes.txt",
        false,
    ),
];

/// The extraction's scripts use fixed paths in /tmp (each has its own in the jail).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn each_case(aged: bool) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut differ = Vec::new();
    for (i, (name, edit, handled)) in CASES.iter().enumerate() {
        let l = layer(&format!("{}-{i}", u8::from(aged)), aged);
        // The snapshot's trust limit, as the pod's snapshot takes it (its clock less 2 s).
        let trust = now() - 2;
        l.run(edit, &[], None);
        let (layered, said) = l.extract(trust, true);
        let (full, said_full) = l.extract(trust, false);
        assert!(!said_full.contains("cra-pod"), "{name}: {said_full}");
        if layered != full {
            differ.push(format!("{name}: layered {layered}, full {full}: {said}"));
        }
        // A base of this second may have entries whose raciness depends on how git was built:
        // those take the whole staging; an aged one never does.
        let took = said.contains("staged from the layer");
        if (aged && took != *handled) || (!handled && took) {
            differ.push(format!(
                "{name}: staged from the layer {took}, expected {handled}: {said}"
            ));
        }
        assert!(
            !said.contains("staging the candidates failed"),
            "{name}: {said}"
        );
    }
    assert_eq!(differ, Vec::<String>::new());
}

#[test]
fn a_layered_end_stages_what_the_whole_staging_does_on_an_aged_base() {
    each_case(true);
}

#[test]
fn a_layered_end_stages_what_the_whole_staging_does_on_a_base_of_this_second() {
    each_case(false);
}

#[test]
fn what_is_not_a_layer_or_a_stream_of_candidates_is_the_whole_staging() {
    let l = layer("refused", true);
    // Not an overlay: a base bound as it is.
    let bound = l.dir.join("bound");
    std::fs::write(
        &bound,
        format!("lower={}/lower\ntarget={}\n", l.dir.display(), l.target),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["candidates", bound.to_str().unwrap(), "1"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"full\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an overlay"));
    // A limit that is no number.
    let out = Command::new(BIN)
        .args(["candidates", l.file.to_str().unwrap(), "x"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"full\n");
    // `receive`: anything but a whole `layered` stream is exit 3, whatever it wrote.
    for input in [
        &b""[..],
        b"full\n",
        b"layered\n",
        b"layered\n5\nab",
        b"layered\n99999999999\n",
        b"nonsense",
    ] {
        let dir = l.dir.join("received");
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = Command::new(BIN)
            .args(["receive", dir.to_str().unwrap()])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), input).unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(3), "{input:?}");
    }
}
