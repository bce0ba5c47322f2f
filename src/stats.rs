//! Run statistics (`handle.stats`, the logger's completed/failed entry, the transcript footer):
//! the pure parts. The CLI's `result` messages give turns, cost, tokens and the model; the
//! implementor's changed files come from a patch: the result's, or the worktree's changes read
//! once for a run that ended without one (also saved beside the transcript).
//!
//! Across follow-up turns of one session (semantic self-correction) the CLI sends one `result`
//! per turn. Observed on CLI 2.1.330: `total_cost_usd` and `modelUsage` are cumulative for
//! the session, `num_turns`, `usage` and `duration_ms` are per turn. So [`RunStats::add_result`]
//! keeps the last cost and the last `modelUsage` totals, and sums `num_turns` (and `usage`,
//! used only when `modelUsage` is absent). `durationMs` is the adapter's own wall clock for
//! the whole session (set by the caller), which exists for sessions that never got a result.

use serde::Serialize;
use serde_json::Value;

use crate::spend::SpendStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_creation: u64,
}

impl Tokens {
    fn add(&mut self, o: Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.cache_read += o.cache_read;
        self.cache_creation += o.cache_creation;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileStatus {
    Added,
    Modified,
    Deleted,
    Renamed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedFile {
    pub path: String,
    pub status: FileStatus,
    pub added: u64,
    pub removed: u64,
}

/// `SessionStats` of the public API.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStats {
    pub duration_ms: u64,
    pub turns: Option<u64>,
    pub cost_usd: Option<f64>,
    pub model: Option<String>,
    pub tokens: Option<Tokens>,
    /// Implementor only (`None` for the other roles, and for an implementor whose run produced
    /// no patch to read).
    pub changed_files: Option<Vec<ChangedFile>>,
    /// The model spend the relay counted (every request of the session, subagents included)
    /// and the budget; `None` for a session whose requests no relay saw (`sandbox: false`).
    pub spend: Option<SpendStats>,
    /// What the model API's failures cost the session.
    pub api: ApiStats,
    /// The interrupted session this one continued (its checkout and conversation), if any.
    pub continued_from: Option<String>,
}

/// `SessionStats.api`: requests the relay sent again after a retryable failure, CLI runs that
/// continued the conversation after the CLI ended on an API failure, and the time requests were
/// held waiting for the API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiStats {
    pub retries: u32,
    pub resumes: u32,
    pub waited_ms: u64,
}

/// Accumulates what the CLI reports over one session.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    turns: Option<u64>,
    cost_usd: Option<f64>,
    init_model: Option<String>,
    /// Cumulative per-model totals from the latest result that had `modelUsage`.
    model_usage: Option<Vec<(String, Tokens)>>,
    /// Sum of per-turn `usage` (fallback when no `modelUsage` came).
    usage_sum: Option<Tokens>,
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl RunStats {
    /// The turns the CLI's results reported (`None`: no run reported any).
    pub fn turns(&self) -> Option<u64> {
        self.turns
    }

    /// `system/init` of the session: the main loop's model.
    pub fn add_init(&mut self, init: &Value) {
        if self.init_model.is_none() {
            self.init_model = init.get("model").and_then(Value::as_str).map(str::to_owned);
        }
    }

    /// One `result` message's accounting fields (`num_turns`, `total_cost_usd`, `usage`,
    /// `modelUsage`), whatever its subtype.
    pub fn add_result(
        &mut self,
        num_turns: Option<u64>,
        total_cost_usd: Option<f64>,
        usage: Option<&Value>,
        model_usage: Option<&Value>,
    ) {
        if let Some(n) = num_turns {
            *self.turns.get_or_insert(0) += n;
        }
        if total_cost_usd.is_some() {
            self.cost_usd = total_cost_usd;
        }
        if let Some(u) = usage.filter(|u| u.is_object()) {
            self.usage_sum
                .get_or_insert_with(Tokens::default)
                .add(Tokens {
                    input: u64_at(u, "input_tokens"),
                    output: u64_at(u, "output_tokens"),
                    cache_read: u64_at(u, "cache_read_input_tokens"),
                    cache_creation: u64_at(u, "cache_creation_input_tokens"),
                });
        }
        if let Some(m) = model_usage.and_then(Value::as_object) {
            self.model_usage = Some(
                m.iter()
                    .map(|(name, u)| {
                        let t = Tokens {
                            input: u64_at(u, "inputTokens"),
                            output: u64_at(u, "outputTokens"),
                            cache_read: u64_at(u, "cacheReadInputTokens"),
                            cache_creation: u64_at(u, "cacheCreationInputTokens"),
                        };
                        (name.clone(), t)
                    })
                    .collect(),
            );
        }
    }

    /// A later CLI run of the same session (a resumed conversation) added: its counts are its
    /// own process's, so they add up.
    pub fn then(&mut self, later: RunStats) {
        if let Some(n) = later.turns {
            *self.turns.get_or_insert(0) += n;
        }
        if let Some(c) = later.cost_usd {
            *self.cost_usd.get_or_insert(0.0) += c;
        }
        if self.init_model.is_none() {
            self.init_model = later.init_model;
        }
        if let Some(u) = later.usage_sum {
            self.usage_sum.get_or_insert_with(Tokens::default).add(u);
        }
        if let Some(models) = later.model_usage {
            let mine = self.model_usage.get_or_insert_with(Vec::new);
            for (name, t) in models {
                match mine.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, acc)) => acc.add(t),
                    None => mine.push((name, t)),
                }
            }
        }
    }

    /// The stats of the session so far. `duration_ms` is the caller's wall clock; `patch` the
    /// implementor's extracted patch (None for other roles or when there is none).
    pub fn finish(&self, duration_ms: u64, patch: Option<&str>) -> SessionStats {
        let tokens = match &self.model_usage {
            Some(models) => Some(models.iter().fold(Tokens::default(), |mut acc, (_, t)| {
                acc.add(*t);
                acc
            })),
            None => self.usage_sum,
        };
        // The init model is what ran the main loop; without an init, the model that wrote the
        // most output (side queries can use a smaller one).
        let model = self.init_model.clone().or_else(|| {
            self.model_usage.as_ref().and_then(|m| {
                m.iter()
                    .max_by_key(|(_, t)| t.output)
                    .map(|(name, _)| name.clone())
            })
        });
        SessionStats {
            duration_ms,
            turns: self.turns,
            cost_usd: self.cost_usd,
            model,
            tokens,
            changed_files: patch.map(changed_files),
            spend: None,
            api: ApiStats::default(),
            continued_from: None,
        }
    }
}

/// The files a `git diff --binary -M` patch changes, with added/removed line counts (binary
/// files count 0/0), in patch order.
pub fn changed_files(patch: &str) -> Vec<ChangedFile> {
    let mut files = Vec::new();
    let mut current: Option<FileSection> = None;
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            if let Some(done) = current.take() {
                files.push(done.finish());
            }
            current = Some(FileSection::new(rest));
        } else if let Some(section) = current.as_mut() {
            section.line(line);
        }
    }
    if let Some(done) = current {
        files.push(done.finish());
    }
    files
}

/// One `diff --git` section being read.
struct FileSection {
    header_path: Option<String>,
    old_path: Option<String>,
    new_path: Option<String>,
    status: FileStatus,
    in_hunks: bool,
    binary: bool,
    added: u64,
    removed: u64,
}

impl FileSection {
    fn new(header: &str) -> Self {
        FileSection {
            header_path: header_new_path(header),
            old_path: None,
            new_path: None,
            status: FileStatus::Modified,
            in_hunks: false,
            binary: false,
            added: 0,
            removed: 0,
        }
    }

    fn line(&mut self, line: &str) {
        if self.in_hunks {
            if self.binary {
                return;
            }
            match line.as_bytes().first() {
                Some(b'+') => self.added += 1,
                Some(b'-') => self.removed += 1,
                _ => {}
            }
            return;
        }
        if line.starts_with("@@") {
            self.in_hunks = true;
        } else if line.starts_with("GIT binary patch") || line.starts_with("Binary files ") {
            self.binary = true;
            self.in_hunks = true;
        } else if line.starts_with("new file mode") {
            self.status = FileStatus::Added;
        } else if line.starts_with("deleted file mode") {
            self.status = FileStatus::Deleted;
        } else if let Some(p) = line.strip_prefix("rename to ") {
            self.status = FileStatus::Renamed;
            self.new_path = Some(unquote(p));
        } else if let Some(p) = line.strip_prefix("+++ ") {
            if p != "/dev/null" {
                self.new_path = Some(strip_side(&unquote(p), "b/"));
            }
        } else if let Some(p) = line.strip_prefix("--- ") {
            if p != "/dev/null" {
                self.old_path = Some(strip_side(&unquote(p), "a/"));
            }
        }
    }

    fn finish(self) -> ChangedFile {
        let path = self
            .new_path
            .or(self.old_path)
            .or(self.header_path)
            .unwrap_or_default();
        ChangedFile {
            path,
            status: self.status,
            added: self.added,
            removed: self.removed,
        }
    }
}

fn strip_side(path: &str, side: &str) -> String {
    path.strip_prefix(side).unwrap_or(path).to_owned()
}

/// The `b/` path of a `diff --git a/P b/P` header, used only when the section has no `+++`,
/// `---` or `rename to` line (binary and mode-only changes, which git never renames without
/// a `rename to`, so both sides are the same path).
fn header_new_path(header: &str) -> Option<String> {
    if header.starts_with('"') {
        // `"a/…" "b/…"`: the second quoted token.
        let second = header.rfind(" \"")?;
        return Some(strip_side(&unquote(&header[second + 1..]), "b/"));
    }
    // `a/P b/P` with P the same on both sides: the length says where the halves meet.
    let half = header.len().checked_sub(1)? / 2;
    let (a, b) = (header.get(..half)?, header.get(half + 1..)?);
    match (a.strip_prefix("a/"), b.strip_prefix("b/")) {
        (Some(pa), Some(pb)) if pa == pb => Some(pb.to_owned()),
        _ => b.strip_prefix("b/").map(str::to_owned),
    }
}

/// A path as git prints it: C-quoted (`"dir/\303\251.txt"`) when `core.quotePath` asks for it,
/// else as is.
fn unquote(s: &str) -> String {
    let Some(inner) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
        return s.to_owned();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut it = inner.bytes().peekable();
    while let Some(b) = it.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        match it.next() {
            Some(d @ b'0'..=b'7') => {
                let mut v = u32::from(d - b'0');
                for _ in 0..2 {
                    if let Some(&n @ b'0'..=b'7') = it.peek() {
                        v = v * 8 + u32::from(n - b'0');
                        it.next();
                    }
                }
                bytes.push(v as u8);
            }
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(b'r') => bytes.push(b'\r'),
            Some(b'a') => bytes.push(7),
            Some(b'b') => bytes.push(8),
            Some(b'f') => bytes.push(12),
            Some(b'v') => bytes.push(11),
            Some(other) => bytes.push(other),
            None => bytes.push(b'\\'),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stats_serialize_in_the_public_camel_case_shape() {
        let s = SessionStats {
            duration_ms: 5,
            turns: Some(2),
            cost_usd: Some(0.5),
            model: Some("m".into()),
            tokens: Some(Tokens {
                input: 1,
                output: 2,
                cache_read: 3,
                cache_creation: 4,
            }),
            changed_files: Some(vec![ChangedFile {
                path: "a".into(),
                status: FileStatus::Renamed,
                added: 1,
                removed: 0,
            }]),
            spend: Some(SpendStats {
                usd: 0.25,
                requests: 3,
                refused: 1,
                budget_usd: Some(0.2),
            }),
            api: ApiStats {
                retries: 3,
                resumes: 1,
                waited_ms: 60_500,
            },
            continued_from: Some("s1".into()),
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"durationMs": 5, "turns": 2, "costUsd": 0.5, "model": "m",
                   "tokens": {"input": 1, "output": 2, "cacheRead": 3, "cacheCreation": 4},
                   "changedFiles": [{"path": "a", "status": "renamed", "added": 1, "removed": 0}],
                   "spend": {"usd": 0.25, "requests": 3, "refused": 1, "budgetUsd": 0.2},
                   "api": {"retries": 3, "resumes": 1, "waitedMs": 60_500}, "continuedFrom": "s1"})
        );
        let empty = serde_json::to_value(SessionStats::default()).unwrap();
        assert_eq!(
            empty,
            json!({"durationMs": 0, "turns": null, "costUsd": null, "model": null, "tokens": null, "changedFiles": null, "spend": null,
                   "api": {"retries": 0, "resumes": 0, "waitedMs": 0}, "continuedFrom": null})
        );
    }

    fn model_usage(input: u64, output: u64) -> Value {
        json!({"claude-x": {"inputTokens": input, "outputTokens": output, "cacheReadInputTokens": 5, "cacheCreationInputTokens": 3, "costUSD": 1.0}})
    }

    #[test]
    fn follow_up_results_sum_turns_and_keep_the_cumulative_cost_and_model_usage() {
        // Figures as the CLI reported them over three turns of one session (2.1.330).
        let mut r = RunStats::default();
        r.add_init(&json!({"model": "claude-x"}));
        let usage = json!({"input_tokens": 100, "output_tokens": 10});
        r.add_result(
            Some(2),
            Some(0.0006),
            Some(&usage),
            Some(&model_usage(100, 10)),
        );
        r.add_result(
            Some(3),
            Some(0.0030),
            Some(&usage),
            Some(&model_usage(630, 21)),
        );
        r.add_init(&json!({"model": "other"}));
        let s = r.finish(1234, None);
        assert_eq!(s.turns, Some(5));
        assert_eq!(s.cost_usd, Some(0.0030));
        assert_eq!(s.model.as_deref(), Some("claude-x"));
        assert_eq!(
            s.tokens,
            Some(Tokens {
                input: 630,
                output: 21,
                cache_read: 5,
                cache_creation: 3
            })
        );
        assert_eq!(s.duration_ms, 1234);
        assert_eq!(s.changed_files, None);
    }

    #[test]
    fn without_model_usage_per_turn_usage_is_summed_and_several_models_add_up() {
        let mut r = RunStats::default();
        let u = json!({"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 2, "cache_creation_input_tokens": 3});
        r.add_result(Some(1), None, Some(&u), None);
        r.add_result(None, None, Some(&u), None);
        let s = r.finish(0, None);
        assert_eq!(
            s.tokens,
            Some(Tokens {
                input: 20,
                output: 2,
                cache_read: 4,
                cache_creation: 6
            })
        );
        let mut r = RunStats::default();
        let two = json!({"big": {"inputTokens": 10, "outputTokens": 50}, "small": {"inputTokens": 7, "outputTokens": 1}});
        r.add_result(None, None, None, Some(&two));
        let s = r.finish(0, None);
        assert_eq!(s.tokens.unwrap().input, 17);
        assert_eq!(
            s.model.as_deref(),
            Some("big"),
            "no init: the model that wrote most"
        );
    }

    #[test]
    fn a_session_without_any_result_has_only_its_duration() {
        let s = RunStats::default().finish(42, None);
        assert_eq!(
            s,
            SessionStats {
                duration_ms: 42,
                ..SessionStats::default()
            }
        );
    }

    const PATCH: &str = "\
diff --git a/src/lib.rs b/src/lib.rs
index 1111111..2222222 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,3 +1,4 @@
 fn a() {}
--- not a header: a removed line starting with two dashes
+++ not a header: an added line starting with two pluses
+added
\\ No newline at end of file
diff --git a/new file.txt b/new file.txt
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/new file.txt
@@ -0,0 +1,2 @@
+one
+two
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
index 4444444..0000000
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/old.rs b/dir/new.rs
similarity 90%
rename from old.rs
rename to dir/new.rs
index 5555555..6666666 100644
--- a/old.rs
+++ b/dir/new.rs
@@ -1 +1 @@
-x
+y
diff --git a/img.png b/img.png
new file mode 100644
index 0000000..7777777
GIT binary patch
literal 3
Kcmb=Jzy$yU+5l<-

literal 0
HcmV?d00001

diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git \"a/caf\\303\\251.txt\" \"b/caf\\303\\251.txt\"
index 8888888..9999999 100644
--- \"a/caf\\303\\251.txt\"
+++ \"b/caf\\303\\251.txt\"
@@ -1 +1,2 @@
 a
+b
";

    #[test]
    fn changed_files_are_read_from_the_patch() {
        let files = changed_files(PATCH);
        let got: Vec<(&str, FileStatus, u64, u64)> = files
            .iter()
            .map(|f| (f.path.as_str(), f.status, f.added, f.removed))
            .collect();
        assert_eq!(
            got,
            [
                ("src/lib.rs", FileStatus::Modified, 2, 1),
                ("new file.txt", FileStatus::Added, 2, 0),
                ("gone.txt", FileStatus::Deleted, 0, 1),
                ("dir/new.rs", FileStatus::Renamed, 1, 1),
                ("img.png", FileStatus::Added, 0, 0),
                ("run.sh", FileStatus::Modified, 0, 0),
                ("café.txt", FileStatus::Modified, 1, 0),
            ]
        );
    }

    #[test]
    fn an_empty_patch_changes_no_files() {
        assert!(changed_files("").is_empty());
    }

    #[test]
    fn the_implementor_patch_becomes_changed_files_in_the_stats() {
        let s = RunStats::default().finish(1, Some(PATCH));
        assert_eq!(s.changed_files.map(|f| f.len()), Some(7));
    }
}
