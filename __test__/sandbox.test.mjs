// One sandbox around the whole session (issue 14), tried through the addon: real CLI, real
// bubblewrap, and every boundary attempted by the agent's own Bash and file tools (scripted
// through the fake Messages API; what each command printed is read back from the tool results
// the CLI sends the model). The test's validator hook approves everything, so only the sandbox
// stands between the agent and the engine. The repositories live under /var/tmp here, not /tmp:
// inside the sandbox /tmp is the session's own private tmpfs, so a write into a host path
// below /tmp would land there (harmlessly) instead of failing visibly.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-sandbox-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { apiError, toolUse } from './support/fake-api.mjs';
import { agentRuns } from './support/agent-bash.mjs';
import { basesOf, rejection, setup, SHARED_BASE } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

const git = (cwd, ...args) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

// Agent definitions that give every role Bash: the boundary must hold for the Planner and the
// Reviewer even when their definition lets them run commands.
const BASH_AGENTS = agentsWithTools(['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep']);

async function sandboxSetup({ config = {}, repo = {}, sideScript } = {}) {
  h = await setup({ repo: { agents: BASH_AGENTS, ...repo }, state: ROLE_STATE, bodies: ROLE_BODIES, config, sideScript });
  return h;
}

/** One session of `role` whose model runs each of `commands` (see agentRuns). */
const run = (role, commands, opts) => agentRuns(h, role, commands, opts);

const branches = (root) => git(root, 'branch', '--format=%(refname:short)').trim().split('\n');
const worktrees = (root) => git(root, 'worktree', 'list', '--porcelain').split('\n').filter((l) => l.startsWith('worktree ')).length - 1;

/** Applies `patch` with `git apply --index` on a clone of `root` at `base`; returns the clone. */
function applyOnBase(root, base, patch) {
  const clone = mkdtempSync(join(tmpdir(), 'cra-apply-'));
  after.push(() => rmSync(clone, { recursive: true, force: true }));
  git(tmpdir(), 'clone', '-q', root, clone);
  git(clone, 'checkout', '-q', base);
  execFileSync('git', ['apply', '--index', '-'], { cwd: clone, input: patch });
  return clone;
}

/** A local HTTP server recording each request's URL (and each TCP connection). */
async function httpServer() {
  const seen = { connections: 0, urls: [] };
  const srv = createServer((req, res) => {
    seen.urls.push(req.url);
    res.end('hello\n');
  });
  srv.on('connection', () => (seen.connections += 1));
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  after.push(() => new Promise((r) => srv.close(r)));
  return { port: srv.address().port, seen };
}

/** Every path under .git except git's own object store and reflogs, and the ignored/untracked status. */
function gitSnapshot(root) {
  const list = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      const rel = relative(root, p);
      if (/^\.git\/(objects|logs)\//.test(`${rel}/`) && rel !== '.git/objects' && rel !== '.git/logs') continue;
      list.push(rel + (e.isDirectory() ? '/' : ''));
      if (e.isDirectory()) walk(p);
    }
  };
  walk(join(root, '.git'));
  return { git: list.sort(), status: git(root, 'status', '--porcelain', '--ignored'), config: readFileSync(join(root, '.git/config'), 'utf8') };
}

describe('Implementor: its clone is its whole writable world', () => {
  it('everyday git works as in a clone (branch, status with only its changes, add -A, commit, stash, branch, log, diff); the patch has every change; the repository is untouched', async () => {
    await sandboxSetup();
    const root = h.repo.root;
    const before = gitSnapshot(root);
    const base = git(root, 'rev-parse', 'main').trim();
    const adapter = h.adapter();
    const { result, out, results } = await run('implementor', [
      'git branch --show-current',
      'git status --porcelain; echo end',
      'printf x > a.txt && mkdir -p d && printf y > d/b.txt && git status --porcelain',
      'git add -A && git commit -q -m "agent commit" && git log -1 --format=%s',
      'echo stashed > s.txt && git add s.txt && git stash -q && git stash list | wc -l && git stash pop -q && cat s.txt',
      'git branch topic && git branch --format="%(refname:short)" | sort | tr "\\n" " "',
      'echo edit >> README.md && git diff --stat | tail -1',
      'git log --oneline | wc -l',
    ], { adapter });
    for (const [i, r] of results.entries()) expect(r.is_error, `command ${i}: ${out[i]}`).toBe(false);
    expect(out[0]).toBe('wi-1');
    expect(out[1]).toBe('end');
    expect(out[2]).toBe('?? a.txt\n?? d/');
    expect(out[3]).toBe('agent commit');
    expect(out[4]).toBe('1\nstashed');
    expect(out[5]).toBe('topic wi-1');
    expect(out[6]).toMatch(/1 file changed, 1 insertion/);
    expect(Number(out[7])).toBe(2);
    expect(result.outcome).toBe('completed');
    for (const f of ['a.txt', 'd/b.txt', 's.txt', 'README.md']) expect(result.patch).toContain(`+++ b/${f}`);
    const applied = applyOnBase(root, base, result.patch);
    expect(readFileSync(join(applied, 's.txt'), 'utf8')).toBe('stashed\n');
    expect(readFileSync(join(applied, 'README.md'), 'utf8')).toBe('# temp repo\nedit\n');
    // The base stays for the next session on the tip until shutdown({ keepBases: false })
    // (src/git/base.rs; the default keeps it for the next process).
    expect(basesOf(root)).toHaveLength(SHARED_BASE ? 1 : 0);
    await adapter.shutdown({ keepBases: false });
    expect(gitSnapshot(root)).toEqual(before);
    expect(branches(root)).toEqual(['main']);
    expect(existsSync(join(root, '.worktrees', 'wi-1'))).toBe(false);
  });

  it('writes outside its clone fail and change nothing: beside the repository, the engine checkout and its .git, another session\'s directory; the engine repository is not even visible', async () => {
    await sandboxSetup();
    const root = h.repo.root;
    const beside = `${root}-beside.txt`;
    after.push(() => rmSync(beside, { force: true }));
    const other = join(root, '.worktrees', 'someone-else');
    mkdirSync(other, { recursive: true });
    after.push(() => rmSync(other, { recursive: true, force: true }));
    const before = gitSnapshot(root);
    const base = git(root, 'rev-parse', 'main').trim();
    const adapter = h.adapter();
    const { result, results, out } = await run('implementor', [
      `echo beside > ${beside}`,
      `echo engine >> ${join(root, 'README.md')}`,
      `touch ${join(root, '.git/objects/planted')}`,
      `git -C ${root} config core.hooksPath /tmp`,
      `touch ${join(other, 'planted')}`,
      `ls -A ${root}; ls -A ${join(root, '.git')}; ls -A ${join(root, '.worktrees')}`,
      'echo inside > inside.txt && cat inside.txt',
      // A layered checkout's base shows only its object store, its layer only its git dir.
      `(cd ${join(root, '.worktrees')} && ls -A .base-* && ls -A .base-*/.git && ls -A .layer-*); true`,
    ], { adapter });
    for (const i of [0, 1, 2, 3, 4]) {
      expect(results[i].is_error, `command ${i}: ${out[i]}`).toBe(true);
      expect(out[i], `command ${i}`).toMatch(/Read-only file system|No such file or directory|not a git repository|not in a git directory|cannot change to/);
    }
    // Only what the session needs: the shared object store and its own clone (layered: the
    // base's object store and the layer's git dir too).
    const seen = out[5].split('\n');
    if (SHARED_BASE) {
      expect(seen.slice(0, 3)).toEqual(['.git', '.worktrees', 'objects']);
      expect(seen.slice(3).sort()).toEqual([basesOf(root)[0], expect.stringMatching(/^\.layer-/), 'wi-1'].sort());
      expect(out[7].split('\n')).toEqual(['.git', 'objects', 'git']);
    } else {
      expect(seen).toEqual(['.git', '.worktrees', 'objects', 'wi-1']);
    }
    expect(out[6]).toBe('inside');
    expect(existsSync(beside) || existsSync(join(other, 'planted'))).toBe(false);
    expect(readFileSync(join(root, 'README.md'), 'utf8')).toBe('# temp repo\n');
    await adapter.shutdown({ keepBases: false }); // the base kept for the next session on the tip goes
    expect(gitSnapshot(root)).toEqual(before);
    expect(git(root, 'rev-parse', 'main').trim()).toBe(base);
    expect(result.patch).toContain('+++ b/inside.txt');
  });

  it('a push of a new branch and a forced push of main fail, to a local-path and a file:// origin; the origin is unchanged', async () => {
    await sandboxSetup();
    const root = h.repo.root;
    const origin = join(h.scratch, 'origin.git');
    git(h.scratch, 'init', '-q', '--bare', origin);
    git(root, 'remote', 'add', 'origin', origin);
    git(root, 'push', '-q', 'origin', 'main');
    const originState = () => ({ main: git(origin, 'rev-parse', 'main').trim(), refs: git(origin, 'for-each-ref', '--format=%(refname) %(objectname)') });
    const before = originState();
    const { out, results } = await run('implementor', [
      'echo x > x.txt && git add x.txt && git commit -q -m x && echo committed',
      `git push ${origin} HEAD:refs/heads/agent-new 2>&1; echo "rc=$?"`,
      `git push -f ${origin} HEAD:main 2>&1; echo "rc=$?"`,
      `git push file://${origin} HEAD:refs/heads/agent-new 2>&1; echo "rc=$?"`,
      // the clone's own origin is the engine repository
      'git push origin HEAD:refs/heads/agent-new 2>&1; echo "rc=$?"',
    ]);
    expect(out[0]).toBe('committed');
    for (const i of [1, 2, 3, 4]) {
      expect(out[i], `push ${i}`).toMatch(/rc=(?!0\b)\d+$/);
      expect(results[i].is_error).toBe(false); // the command ran; git itself failed
    }
    expect(originState()).toEqual(before);
    expect(branches(root)).toEqual(['main']);
  });

  it("git config and hooks the agent plants in its clone never run outside the sandbox (the adapter's own git stages the clone for the patch)", async () => {
    await sandboxSetup();
    const pwned = join(h.scratch, 'pwned');
    const { result, out } = await run('implementor', [
      `git config core.fsmonitor "touch ${pwned}; false" && g=$(git rev-parse --git-dir) && mkdir -p $g/hooks && printf '#!/bin/sh\ntouch ${pwned}\n' > $g/hooks/post-commit && chmod +x $g/hooks/post-commit && echo planted`,
      'echo work > work.txt && git add -A && git commit -q -m w 2>&1; echo "rc=$?"',
    ]);
    expect(out[0]).toBe('planted');
    expect(out[1]).toMatch(/rc=0$/);
    expect(result.patch).toContain('+++ b/work.txt');
    expect(existsSync(pwned)).toBe(false);
  });

  for (const [label, config] of [['', {}], [' (also with sandbox: false)', { sandbox: false }]]) {
    it(`branches the agent makes live and go with its clone; the patch carries their work${label}`, async () => {
      await sandboxSetup({ config });
      const root = h.repo.root;
      const base = git(root, 'rev-parse', 'main').trim();
      const { result, out } = await run('implementor', [
        'git checkout -q -b agent-x && echo b > b.txt && git add b.txt && git commit -q -m b && git branch agent-y && git branch --show-current',
      ]);
      expect(out[0]).toBe('agent-x');
      expect(result.patch).toContain('+++ b/b.txt');
      expect(readFileSync(join(applyOnBase(root, base, result.patch), 'b.txt'), 'utf8')).toBe('b\n');
      expect(branches(root)).toEqual(['main']);
      expect(worktrees(root)).toBe(0);
    });
  }
});

describe('what a session sees', () => {
  it('Bash and the Read tool cannot read a file beside the repository; HOME is private; /proc shows only the session; no key or token in any environ or cmdline; no capabilities', async () => {
    await sandboxSetup();
    const root = h.repo.root;
    const beside = join(root, '..', '.env');
    writeFileSync(beside, 'SECRET=beside-the-repository\n');
    after.push(() => rmSync(beside, { force: true }));
    // A HOME of the test's own, whatever HOME the suite runs with (CRA_TEST_REAL_HOME).
    h.config.env.HOME = join(h.scratch, 'home');
    mkdirSync(h.config.env.HOME);
    writeFileSync(join(h.config.env.HOME, '.bashrc'), '# profile\n');
    const apiKey = h.config.env.ANTHROPIC_API_KEY;
    h.config.env.NPM_TOKEN = 'npm_passed_through_config_env';
    const { result, results, out } = await run('planner', [
      `cat ${beside}`,
      toolUse('Read', { file_path: beside }),
      'ls -A "$HOME"; cat "$HOME/.bashrc"',
      'ls /proc | grep -E "^[0-9]+$" | wc -l',
      'cat /proc/$PPID/environ | tr "\\0" "\\n" | cut -d= -f1 | sort | tr "\\n" " "',
      'cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" "\\n" | sort -u',
      'grep CapEff /proc/self/status',
      `touch ${join(root, 'planted')} 2>&1; echo "rc=$?"`,
      'echo more >> "$HOME/.gitconfig" 2>&1; echo "rc=$?"',
      'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline; echo; done',
    ]);
    expect(results[0].is_error).toBe(true);
    expect(out[0]).toMatch(/No such file or directory/);
    expect(results[1].is_error).toBe(true);
    expect(out[1]).not.toContain('beside-the-repository');
    // the user's dotfiles are not there (issue 19): the generated git config is
    expect(out[2]).not.toContain('# profile');
    expect(out[2]).toContain('.gitconfig');
    expect(out[2]).not.toContain('claude-config');
    expect(Number(out[3])).toBeLessThan(20);
    expect(out[4]).toContain('ANTHROPIC_API_KEY');
    for (const o of [out[4], out[5]]) {
      expect(o).not.toContain(apiKey);
      expect(o).not.toContain('npm_passed_through_config_env');
      expect(o).not.toContain('NPM_TOKEN');
    }
    expect(out[5]).toContain('sk-ant-sandbox-placeholder-');
    // the engine's own processes (this test's vitest worker) are not in its /proc
    // (bwrap's own argv names the mounts, among them packages of the engine's node_modules/.bin)
    expect(out[9].split('\n').filter((l) => !/^\S*bwrap /.test(l))).not.toEqual(expect.arrayContaining([expect.stringMatching(/vitest/)]));
    expect(out[9]).toMatch(/bwrap/);
    expect(out[6]).toMatch(/CapEff:\s+0+$/);
    expect(out[7]).toMatch(/Read-only file system[\s\S]*rc=1$/);
    expect(out[8]).toMatch(/Read-only file system[\s\S]*rc=1$/);
    expect(result.create).toEqual([]);
    // the model API still got the real key, added by the relay outside the sandbox
    expect(h.api.mainRequests().every((r) => r.headers['x-api-key'] === apiKey)).toBe(true);
  });
});

describe('sandbox.allowRead and sandbox.allowWrite', () => {
  it('a directory beside the repository is readable with allowRead (and still not writable), writable with allowWrite', async () => {
    const shared = mkdtempSync(join(tmpdir(), 'cra-shared-'));
    const out_ = mkdtempSync(join(tmpdir(), 'cra-out-'));
    after.push(() => rmSync(shared, { recursive: true, force: true }));
    after.push(() => rmSync(out_, { recursive: true, force: true }));
    writeFileSync(join(shared, 'spec.md'), 'shared spec\n');
    await sandboxSetup({ config: { sandbox: { allowRead: [shared], allowWrite: [out_] } } });
    const { out } = await run('implementor', [
      `cat ${join(shared, 'spec.md')}`,
      `echo x >> ${join(shared, 'spec.md')} 2>&1; echo "rc=$?"`,
      `echo report > ${join(out_, 'report.txt')} && echo wrote`,
      'echo w > w.txt',
    ]);
    expect(out[0]).toBe('shared spec');
    expect(out[1]).toMatch(/Read-only file system[\s\S]*rc=1$/);
    expect(out[2]).toBe('wrote');
    expect(readFileSync(join(out_, 'report.txt'), 'utf8')).toBe('report\n');
    expect(readFileSync(join(shared, 'spec.md'), 'utf8')).toBe('shared spec\n');
  });
});

describe('Planner and Reviewer write nothing in the repository', () => {
  for (const role of ['planner', 'reviewer']) {
    it(`${role}: a Bash write in its cwd, a branch and a commit all fail; temp dirs stay writable`, async () => {
      await sandboxSetup();
      const root = h.repo.root;
      const main = git(root, 'rev-parse', 'main').trim();
      const { out, results } = await run(role, [
        'echo x >> README.md',
        'touch planted.txt',
        'git branch agent-p',
        'git commit -q --allow-empty -m sneaky',
        'touch .git/planted',
        'echo ok > "$TMPDIR/scratch" && cat "$TMPDIR/scratch"',
      ]);
      for (const i of [0, 1, 2, 3, 4]) expect(results[i].is_error, `${out[i]}`).toBe(true);
      expect(out[5]).toBe('ok');
      expect(readFileSync(join(root, 'README.md'), 'utf8')).toBe('# temp repo\n');
      expect(existsSync(join(root, 'planted.txt')) || existsSync(join(root, '.git/planted'))).toBe(false);
      expect(git(root, 'rev-parse', 'main').trim()).toBe(main);
      expect(branches(root)).toEqual(['main']);
      expect(git(root, 'status', '--porcelain')).toBe('');
    });
  }
});

describe('network: no host unless config.sandbox.allowedDomains names it', () => {
  it('a local HTTP server sees no connection from git ls-remote, bash /dev/tcp or curl', async () => {
    await sandboxSetup();
    const { port, seen } = await httpServer();
    const { out } = await run('reviewer', [
      `git ls-remote http://127.0.0.1:${port}/x 2>&1; echo "rc=$?"`,
      `(exec 3<>/dev/tcp/127.0.0.1/${port} && echo connected) 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 http://127.0.0.1:${port}/default 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' http://127.0.0.1:${port}/via-proxy 2>&1; echo "rc=$?"`,
      `NO_PROXY= no_proxy= git ls-remote http://127.0.0.1:${port}/x 2>&1; echo "rc=$?"`,
    ]);
    expect(seen).toEqual({ connections: 0, urls: [] });
    for (const o of out.slice(0, 3)) expect(o).toMatch(/rc=(?!0\b)\d+$/);
    expect(out[3]).toContain('host not in sandbox.allowedDomains');
    // the engine hears of each attempt that reached the egress proxy
    const blocked = h.logger.entries.filter((e) => e.message === 'network access blocked by the sandbox');
    expect(blocked.some((e) => e.data.host === '127.0.0.1' && e.data.port === port && e.data.role === 'reviewer')).toBe(true);
  });

  it('with 127.0.0.1 in allowedDomains the server is reached through the proxy (NO_PROXY bypassed); a direct /dev/tcp still is not', async () => {
    const { port, seen } = await httpServer();
    await sandboxSetup({ config: { sandbox: { allowedDomains: [`127.0.0.1:${port}`] } } });
    const { out } = await run('reviewer', [
      `curl -sS -m 5 http://127.0.0.1:${port}/direct 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' http://127.0.0.1:${port}/curl 2>&1; echo "rc=$?"`,
      `NO_PROXY= no_proxy= git ls-remote http://127.0.0.1:${port}/repo 2>&1; echo "rc=$?"`,
      `(exec 3<>/dev/tcp/127.0.0.1/${port} && echo connected) 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' http://localhost:${port}/not-allowed 2>&1; echo "rc=$?"`,
    ]);
    // NO_PROXY, set by the CLI's sandbox, sends loopback direct, into the sandbox's own
    // network namespace, where nothing listens.
    expect(out[0]).toMatch(/rc=(?!0\b)\d+$/);
    expect(out[1]).toBe('hello\nrc=0');
    expect(seen.urls.some((u) => u.endsWith('/curl'))).toBe(true);
    expect(seen.urls.some((u) => u.includes('/repo/info/refs'))).toBe(true);
    expect(out[3]).toMatch(/rc=(?!0\b)\d+$/);
    expect(out[4]).toContain('host not in sandbox.allowedDomains');
    expect(seen.urls.some((u) => u.includes('not-allowed') || u.includes('direct'))).toBe(false);
  });
});

describe('network boundary: the proxy admits public addresses of listed hosts on their ports, with their own Host', () => {
  /** Refusals the engine heard of, as `host:port reason`. */
  const refusals = () => h.logger.entries.filter((e) => e.message === 'network access blocked by the sandbox').map((e) => `${e.data.host}:${e.data.port} ${e.data.reason}`);

  it('an allowed name that resolves to loopback is refused; the IP literal entry reaches the same server', async () => {
    const { port, seen } = await httpServer();
    await sandboxSetup({ config: { sandbox: { allowedDomains: [`localhost:${port}`, `127.0.0.1:${port}`] } } });
    const { out } = await run('reviewer', [
      `curl -sS -m 5 --noproxy '' http://localhost:${port}/by-name 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' -x socks5h://127.0.0.1:3128 http://localhost:${port}/by-name-socks 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' http://127.0.0.1:${port}/by-ip 2>&1; echo "rc=$?"`,
    ]);
    expect(out[0]).toContain('not a public address');
    expect(out[1]).toMatch(/rc=(?!0\b)\d+$/);
    expect(out[2]).toBe('hello\nrc=0');
    expect(seen.urls).toEqual(['/by-ip']);
    const refused = refusals();
    expect(refused.filter((r) => r.startsWith(`localhost:${port} localhost resolves to`))).toHaveLength(2);
  });

  it('with bare entries on port 80: a name resolving to loopback and a Host naming another host are refused before any connection', async () => {
    await sandboxSetup({ config: { sandbox: { allowedDomains: ['localhost', '127.0.0.1'] } } });
    const { out } = await run('reviewer', [
      `curl -sS -m 5 --noproxy '' http://localhost/by-name 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' -H 'Host: metadata.google.internal' http://127.0.0.1/vhost 2>&1; echo "rc=$?"`,
    ]);
    expect(out[0]).toContain('not a public address');
    expect(out[1]).toContain('does not name the request');
    const refused = refusals();
    expect(refused.some((r) => r.startsWith('localhost:80 localhost resolves to'))).toBe(true);
    expect(refused.some((r) => r.startsWith('127.0.0.1:80 the Host header'))).toBe(true);
  });

  it('a plain-HTTP request whose Host header names another host is refused', async () => {
    const { port, seen } = await httpServer();
    await sandboxSetup({ config: { sandbox: { allowedDomains: [`127.0.0.1:${port}`] } } });
    const { out } = await run('reviewer', [
      `curl -sS -m 5 --noproxy '' -H 'Host: metadata.google.internal' http://127.0.0.1:${port}/vhost 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' http://127.0.0.1:${port}/same-host 2>&1; echo "rc=$?"`,
    ]);
    expect(out[0]).toContain('does not name the request');
    expect(out[1]).toBe('hello\nrc=0');
    expect(seen.urls).toEqual(['/same-host']);
    expect(refusals().some((r) => r.startsWith(`127.0.0.1:${port} the Host header "metadata.google.internal"`))).toBe(true);
  });

  it('a port other than 80 and 443 is refused unless allowedDomains lists host:port', async () => {
    const { port, seen } = await httpServer();
    const other = await httpServer();
    await sandboxSetup({ config: { sandbox: { allowedDomains: ['127.0.0.1', `127.0.0.1:${other.port}`] } } });
    const { out } = await run('reviewer', [
      `curl -sS -m 5 --noproxy '' http://127.0.0.1:${port}/unlisted-port 2>&1; echo "rc=$?"`,
      `curl -sS -m 5 --noproxy '' http://127.0.0.1:${other.port}/listed-port 2>&1; echo "rc=$?"`,
    ]);
    expect(out[0]).toContain(`port ${port} not allowed`);
    expect(out[1]).toBe('hello\nrc=0');
    expect(seen).toEqual({ connections: 0, urls: [] });
    expect(other.seen.urls).toEqual(['/listed-port']);
  });
});

describe('the model relay: the real key goes only where the placeholder belongs, and never comes back in', () => {
  // Like the real API, which quotes an unknown anthropic-beta value in its 400, the fake API's
  // answer to the agent's own requests quotes the headers it got.
  const quoting = (_body, req) => apiError(400, `unknown beta ${req.headers['anthropic-beta']}; key ${req.headers['x-api-key']}`);

  it("the agent's curl with the placeholder in anthropic-beta is refused; a legitimate one gets the key masked in the answer; other routes are not relayed", async () => {
    await sandboxSetup({ sideScript: quoting });
    const apiKey = h.config.env.ANTHROPIC_API_KEY;
    const { result, out } = await run('implementor', [
      `curl -sS "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-beta: $ANTHROPIC_API_KEY" -d '{}' 2>&1; echo "rc=$?"`,
      `curl -sS "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-beta: b1" -d '{}' 2>&1; echo "rc=$?"`,
      `curl -sS "$ANTHROPIC_BASE_URL/v1/models" -H "x-api-key: $ANTHROPIC_API_KEY" 2>&1; echo "rc=$?"`,
      `curl -sS "$ANTHROPIC_BASE_URL/v1/messages?key=$ANTHROPIC_API_KEY" -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}' 2>&1; echo "rc=$?"`,
      'echo done > done.txt',
    ]);
    for (const o of out) expect(o).not.toContain(apiKey);
    expect(out[0]).toContain('the credential placeholder is in the anthropic-beta header');
    expect(out[1]).toContain(`unknown beta b1; key ${'*'.repeat(apiKey.length)}`);
    expect(out[2]).toContain('GET /v1/models is not a Messages API route');
    expect(out[3]).toContain('the credential placeholder is in the request target');
    expect(result.outcome).toBe('completed');
    // Each refusal is in the engine's log.
    const logged = h.logger.entries.map((e) => e.message).filter((m) => m.startsWith('model relay: refused'));
    expect(logged).toEqual([
      'model relay: refused POST /v1/messages: the credential placeholder is in the anthropic-beta header',
      'model relay: refused GET /v1/models: not a route the CLI uses',
      'model relay: refused POST /v1/messages: the credential placeholder is in the request target',
    ]);
    // The fake API saw the key only as the x-api-key of legitimate requests (the CLI's own,
    // and the agent's second curl), never in another header, a URL or a body.
    const agents = h.api.requests.filter((r) => r.kind !== 'main');
    expect(agents.map((r) => `${r.method} ${r.path} ${r.headers['anthropic-beta']}`)).toEqual(['POST /v1/messages b1']);
    for (const r of h.api.requests) {
      const { 'x-api-key': key, ...others } = r.headers;
      expect(key).toBe(apiKey);
      expect(JSON.stringify([others, r.path, r.query, r.body])).not.toContain(apiKey);
    }
  });
});

describe("the CLI's own web tools go through the egress proxy too", () => {
  it('a WebFetch of a host outside allowedDomains fails for the model and its attempt is logged as blocked', async () => {
    await sandboxSetup({ repo: { agents: agentsWithTools(['Bash', 'Read', 'WebFetch']) } });
    const { handle, results } = await run('planner', [toolUse('WebFetch', { url: 'http://example.com/page', prompt: 'summarize' })]);
    expect(results[0].is_error, results[0].text).toBe(true);
    // The CLI asks api.anthropic.com whether the domain is safe first: that request, made by the
    // CLI process itself (not a Bash command), reached the proxy and was refused.
    const blocked = h.logger.entries.filter((e) => e.message === 'network access blocked by the sandbox' && e.data.role === 'planner');
    expect(blocked.map((e) => `${e.data.host}:${e.data.port}`)).toContain('api.anthropic.com:443');
    expect(readFileSync(handle.logFilePath, 'utf8')).toMatch(/\[network\] blocked \w+ api\.anthropic\.com:443/);
  });
});

describe('credentials stay out of agent commands', () => {
  it('env run by the agent shows neither a token in the engine environment, one passed in config.env, nor the model API key (a placeholder stands in for it); the session works', async () => {
    await sandboxSetup();
    const planted = 'ghp_planted_in_the_engine_environment';
    const previous = process.env.GITHUB_TOKEN;
    process.env.GITHUB_TOKEN = planted;
    after.push(() => (previous === undefined ? delete process.env.GITHUB_TOKEN : (process.env.GITHUB_TOKEN = previous)));
    h.config.env.NPM_TOKEN = 'npm_passed_through_config_env';
    const apiKey = h.config.env.ANTHROPIC_API_KEY;
    const { result, out } = await run('implementor', ['env', 'env | grep -E "TOKEN|API_KEY" | cut -d= -f1; echo done > done.txt']);
    expect(out[0]).toContain('PATH=');
    for (const secret of [planted, 'npm_passed_through_config_env', apiKey]) expect(out[0]).not.toContain(secret);
    // Not even as names; the model key is there only as the relay's placeholder.
    const names = out[1].split('\n').filter(Boolean);
    for (const name of ['GITHUB_TOKEN', 'NPM_TOKEN']) expect(names).not.toContain(name);
    expect(out[0]).toMatch(/^ANTHROPIC_API_KEY=sk-ant-sandbox-placeholder-[0-9a-f]{32}$/m);
    expect(result.outcome).toBe('completed');
    // the model API still got the real key, added by the relay outside the sandbox
    expect(h.api.mainRequests().every((r) => r.headers['x-api-key'] === apiKey)).toBe(true);
  });
});

describe('a claude login instead of a key', () => {
  it("with no credential variable, the login's OAuth token reaches the model API through the relay; inside there is only a placeholder and no login file", async () => {
    await sandboxSetup();
    delete h.config.env.ANTHROPIC_API_KEY;
    const token = 'sk-ant-oat01-token-of-the-login';
    writeFileSync(join(h.config.env.CLAUDE_CONFIG_DIR, '.credentials.json'), JSON.stringify({ claudeAiOauth: { accessToken: token, refreshToken: 'r' } }));
    // The CLI's own environment (the command's parent); the CLI does not pass the token on.
    const { result, out } = await run('planner', ['tr "\\0" "\\n" < /proc/$PPID/environ | grep -E "^CLAUDE_CODE_OAUTH_TOKEN="; ls -A "$CLAUDE_CONFIG_DIR" | grep -c credentials']);
    expect(out[0]).toMatch(/^CLAUDE_CODE_OAUTH_TOKEN=sk-ant-sandbox-placeholder-[0-9a-f]{32}\n0$/);
    expect(result.create).toEqual([]);
    expect(h.api.mainRequests().every((r) => r.headers.authorization === `Bearer ${token}`)).toBe(true);
  });
});

describe('fail closed / knowingly off', () => {
  /** A bin dir with git, node, sh and socat but no bwrap: the PATH the CLI would get. */
  function pathWithout(missing) {
    const bin = join(h.scratch, 'bin');
    mkdirSync(bin, { recursive: true });
    for (const tool of ['git', 'node', 'sh', 'bash', 'bwrap', 'socat'].filter((t) => !missing.includes(t))) {
      symlinkSync(execFileSync('sh', ['-c', `command -v ${tool}`]).toString().trim(), join(bin, tool));
    }
    return bin;
  }

  it('bubblewrap absent from PATH: ERR_SANDBOX_UNAVAILABLE naming it and the install line; nothing is created', async () => {
    await sandboxSetup();
    h.config.env.PATH = pathWithout(['bwrap']);
    const logsDir = h.config.logging.logsDir;
    const err = await rejection(h.adapter().startAgent(ROLES.implementor.params('wi-nosandbox')));
    expect(err.code).toBe('ERR_SANDBOX_UNAVAILABLE');
    expect(err.message).toMatch(/^\[ERR_SANDBOX_UNAVAILABLE\] /);
    expect(err.message).toContain('bubblewrap (bwrap)');
    expect(err.message).not.toContain('socat on PATH');
    expect(err.message).toContain('apt-get install -y bubblewrap socat');
    expect({ worktrees: worktrees(h.repo.root), branches: branches(h.repo.root) }).toEqual({ worktrees: 0, branches: ['main'] });
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-nosandbox'))).toBe(false);
    expect(existsSync(logsDir) ? readdirSync(logsDir) : []).toEqual([]);
    expect(h.api.requests).toEqual([]);
  });

  it('a bubblewrap that cannot build a sandbox here (no user namespaces): ERR_SANDBOX_UNAVAILABLE quoting it; nothing is created', async () => {
    await sandboxSetup();
    const bin = pathWithout(['bwrap']);
    writeFileSync(join(bin, 'bwrap'), '#!/bin/sh\necho "bwrap: setting up uid map: Permission denied" >&2\nexit 1\n', { mode: 0o755 });
    h.config.env.PATH = bin;
    const err = await rejection(h.adapter().startAgent(ROLES.implementor.params('wi-nobwrap')));
    expect(err.code).toBe('ERR_SANDBOX_UNAVAILABLE');
    expect(err.message).toContain('cannot create a sandbox here');
    expect(err.message).toContain('setting up uid map: Permission denied');
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-nobwrap'))).toBe(false);
    expect(h.api.requests).toEqual([]);
  });

  it('socat absent from PATH: ERR_SANDBOX_UNAVAILABLE naming socat', async () => {
    await sandboxSetup();
    h.config.env.PATH = pathWithout(['socat']);
    const err = await rejection(h.adapter().startAgent(ROLES.planner.params()));
    expect(err.code).toBe('ERR_SANDBOX_UNAVAILABLE');
    expect(err.message).toContain('needs socat on PATH');
    expect(h.api.requests).toEqual([]);
  });

  it('sandbox: false logs a warning at createClaudeAdapter and the session runs unconfined', async () => {
    await sandboxSetup({ config: { sandbox: false } });
    const beside = `${h.repo.root}-beside.txt`;
    after.push(() => rmSync(beside, { force: true }));
    const adapter = h.adapter();
    // Logged before createClaudeAdapter returns.
    const warning = h.logger.entries.find((e) => /config\.sandbox: false/.test(e.message));
    expect(warning.level).toBe('warn');
    expect(warning.message).toContain('the OS sandbox is off');
    expect(h.logger.entries.some((e) => e.message === 'starting agent session')).toBe(false);
    const { result, out } = await run('implementor', [`echo beside > ${beside} && echo wrote && touch inside.txt`], { adapter });
    expect(out[0]).toBe('wrote');
    expect(readFileSync(beside, 'utf8')).toBe('beside\n');
    expect(result.outcome).toBe('completed');
  });
});

describe('the sandbox leaves nothing in the engine repository', () => {
  it('after Implementor, Planner and Reviewer sessions the main checkout and .git are as before', async () => {
    await sandboxSetup();
    const root = h.repo.root;
    const before = gitSnapshot(root);
    const adapter = h.adapter();
    const impl = await run('implementor', ['echo a > a.txt && git add a.txt && git commit -q -m a && git checkout -q -b agent-z && echo ok'], { adapter });
    expect(impl.out[0]).toBe('ok');
    await run('planner', ['git status --porcelain; ls -a'], { adapter });
    await run('reviewer', ['git log --oneline -1'], { adapter });
    // Kept for the next sessions on the tip until shutdown({ keepBases: false })
    // (src/git/base.rs): the Implementors' base (layered) and the Planner's and Reviewer's view.
    expect(basesOf(root)).toHaveLength(SHARED_BASE ? 2 : 1);
    await adapter.shutdown({ keepBases: false });
    expect(gitSnapshot(root)).toEqual(before);
    expect(branches(root)).toEqual(['main']);
  });
});
