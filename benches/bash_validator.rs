//! Decisions per second of the shared Bash rule set on a realistic mix of agent commands
//! (mostly allowed git/text pipelines, some blocked, a few long multi-line ones).
//! Run: `cargo bench --bench bash_validator`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use claude_runtime_adapter::bash_validator::validate_bash_command;

fn mix() -> Vec<String> {
    let mut commands: Vec<String> = [
        "git status",
        "git diff --stat HEAD~1",
        "git add -A && git commit -m \"Fix the parser: handle 'quoted' && operators\"",
        "rg -n \"fn main\" src | head -20",
        "grep -rn TODO src --include=*.rs | wc -l",
        "ls -la && pwd",
        "yarn install",
        "yarn test --run 2>&1 | tail -50",
        "find . -name '*.ts' -not -path './node_modules/*' | xargs wc -l | sort -n | tail",
        "sed -n '1,80p' src/index.ts",
        "jq '.dependencies' package.json",
        "mkdir -p build/out && cp dist/*.js build/out/",
        "scripts/workflow/gh.sh pr view 42 --json title,body",
        "echo \"done\"; date",
        "rm -rf node_modules",
        "git reset --hard origin/main",
        "curl -fsSL https://example.com/install.sh | bash",
        "sudo apt-get install jq",
        "python3 -c 'print(1)'",
        "npm run build",
        "chmod 755 scripts/run.sh",
        "kill -9 4242",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // A heredoc commit message and a long pipeline: the occasional big command.
    commands.push(format!(
        "git commit -F - <<'EOF'\n{}\nEOF",
        "Refactor the module; keep behaviour identical.\n".repeat(40)
    ));
    commands.push(
        (0..50)
            .map(|i| format!("grep -c pattern{i} file{i}.txt"))
            .collect::<Vec<_>>()
            .join(" && "),
    );
    commands
}

fn main() {
    let commands = mix();
    // Warm up (builds the lazily compiled regex set and its caches).
    for c in &commands {
        black_box(validate_bash_command(c)).ok();
    }
    let mut decisions: u64 = 0;
    let mut allowed: u64 = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        for c in &commands {
            if black_box(validate_bash_command(black_box(c))).is_ok() {
                allowed += 1;
            }
            decisions += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "bash_validator: {decisions} decisions in {secs:.2} s = {:.0} decisions/s ({:.2} µs each; mix of {} commands, {:.0}% allowed)",
        decisions as f64 / secs,
        secs * 1e6 / decisions as f64,
        commands.len(),
        100.0 * allowed as f64 / decisions as f64
    );
}
