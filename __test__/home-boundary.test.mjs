// Issue 19, items 2 and 3: a developer's usual home, tried through the addon with the real CLI
// and real bubblewrap. A scratch HOME laid out like a real one — a profile that exports a token
// and sets PATH up for nvm, rustup's cargo, pyenv and ~/.local/bin, a global git config with a
// token in a url rewrite and a credential helper, and the secrets that live beside each
// toolchain (nvm's global npmrc, cargo's config.toml, fish history and auth files under
// ~/.local/share, other repositories under ~/go/src). The engine's own PATH has none of the
// toolchains: the agent finds them through the profile's PATH, read outside the sandbox.
// The toolchains are real: node and npm copied from this machine, the machine's rustup proxy
// and toolchain, its pyenv, a real venv. The agent's commands read none of the secrets while
// every toolchain runs (cargo builds and runs a crate).
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, readFileSync, readdirSync, realpathSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-sandbox-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { agentRuns } from './support/agent-bash.mjs';
import { setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE } from './support/roles.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

const SECRETS = {
  profile: 'ghp_PROFILE_EXPORTED_TOKEN_1',
  gitUrl: 'ghp_GITCONFIG_URL_TOKEN_2',
  npmrc: 'npm_NVM_GLOBAL_AUTHTOKEN_3',
  cargo: 'cargo_REGISTRY_TOKEN_4',
  cargoCred: 'cargo_CREDENTIALS_TOKEN_5',
  fish: 'FISH_HISTORY_SECRET_6',
  auth: 'LOCAL_SHARE_AUTH_JSON_7',
  gopath: 'OTHER_REPOSITORY_SECRET_8',
};

const write = (p, text, mode) => {
  mkdirSync(dirname(p), { recursive: true });
  writeFileSync(p, text);
  if (mode) chmodSync(p, mode);
};
const git = (cwd, ...args) => execFileSync('git', args, { cwd }).toString().trim();
const sh = (cmd) => execFileSync('sh', ['-c', cmd]).toString().trim();

/** The machine's own toolchains this home borrows (a fresh CI machine of this kind has them). */
function machineToolchains() {
  const rustupHome = process.env.RUSTUP_HOME ?? join(process.env.HOME, '.rustup');
  const sysroot = sh('rustc --print sysroot');
  const pyenvRoot = process.env.PYENV_ROOT ?? join(process.env.HOME, '.pyenv');
  const pyVersion = readdirSync(join(pyenvRoot, 'versions')).find((v) => /^3\.\d+\.\d+$/.test(v));
  const rustup = realpathSync(sh('command -v rustup || echo $HOME/.cargo/bin/rustup'));
  const npmDir = dirname(dirname(realpathSync(sh('command -v npm'))));
  return { rustupHome, sysroot, pyenvRoot, pyVersion, rustup, npmDir, node: process.execPath };
}

/** A home as a developer's looks, at `home`; returns the PATH its profile sets up. */
function developerHome(home) {
  const m = machineToolchains();
  // nvm: node and npm in a version prefix, npm through ../lib; a global npmrc with a token.
  const nvm = join(home, '.nvm/versions/node/v20.0.0');
  mkdirSync(join(nvm, 'bin'), { recursive: true });
  copyFileSync(m.node, join(nvm, 'bin/node'));
  chmodSync(join(nvm, 'bin/node'), 0o755);
  cpSync(m.npmDir, join(nvm, 'lib/node_modules/npm'), { recursive: true });
  symlinkSync('../lib/node_modules/npm/bin/npm-cli.js', join(nvm, 'bin/npm'));
  write(join(nvm, 'etc/npmrc'), `//registry.npmjs.org/:_authToken=${SECRETS.npmrc}\n`);
  // rustup: the proxy in ~/.cargo/bin, the machine's toolchain linked into ~/.rustup; cargo's
  // config and credentials with tokens beside it.
  mkdirSync(join(home, '.cargo/bin'), { recursive: true });
  copyFileSync(m.rustup, join(home, '.cargo/bin/rustup'));
  chmodSync(join(home, '.cargo/bin/rustup'), 0o755);
  for (const p of ['cargo', 'rustc']) symlinkSync('rustup', join(home, '.cargo/bin', p));
  const toolchain = m.sysroot.split('/').at(-1);
  mkdirSync(join(home, '.rustup/toolchains'), { recursive: true });
  symlinkSync(m.sysroot, join(home, '.rustup/toolchains', toolchain));
  write(join(home, '.rustup/settings.toml'), `version = "12"\ndefault_toolchain = "${toolchain}"\nprofile = "minimal"\n`);
  write(join(home, '.cargo/config.toml'), `[registry]\ntoken = "${SECRETS.cargo}"\n`);
  write(join(home, '.cargo/credentials.toml'), `[registry]\ntoken = "${SECRETS.cargoCred}"\n`);
  // pyenv: its libexec, a shim pointing at this home's pyenv, the machine's version linked in.
  const pyenv = join(home, '.pyenv');
  cpSync(join(m.pyenvRoot, 'libexec'), join(pyenv, 'libexec'), { recursive: true });
  mkdirSync(join(pyenv, 'bin'), { recursive: true });
  symlinkSync('../libexec/pyenv', join(pyenv, 'bin/pyenv'));
  mkdirSync(join(pyenv, 'versions'), { recursive: true });
  symlinkSync(join(m.pyenvRoot, 'versions', m.pyVersion), join(pyenv, 'versions', m.pyVersion));
  write(join(pyenv, 'version'), `${m.pyVersion}\n`);
  const shim = readFileSync(join(m.pyenvRoot, 'shims/python'), 'utf8').replaceAll(m.pyenvRoot, pyenv);
  write(join(pyenv, 'shims/python'), shim, 0o755);
  // A pipx tool: a real venv under ~/.local/share, its entry point symlinked into ~/.local/bin;
  // shell history and an auth file beside it.
  const venv = join(home, '.local/share/pipx/venvs/hello');
  execFileSync(join(m.pyenvRoot, 'versions', m.pyVersion, 'bin/python3'), ['-m', 'venv', '--without-pip', venv]);
  write(join(venv, 'bin/hello'), `#!${venv}/bin/python\nimport sys\nprint("hello from", sys.prefix)\n`, 0o755);
  mkdirSync(join(home, '.local/bin'), { recursive: true });
  symlinkSync(join(venv, 'bin/hello'), join(home, '.local/bin/hello'));
  write(join(home, '.local/share/fish/fish_history'), `- cmd: export TOKEN=${SECRETS.fish}\n`);
  write(join(home, '.local/share/someapp/auth.json'), `{"token":"${SECRETS.auth}"}\n`);
  // Go: a GOPATH with a tool in bin and other repositories in src.
  write(join(home, 'go/bin/gotool'), '#!/bin/sh\necho gotool ran\n', 0o755);
  write(join(home, 'go/src/github.com/other/repo/secret.txt'), `${SECRETS.gopath}\n`);
  // The profile sets PATH up and exports a token; the global git config has identity, a token
  // in a url rewrite and a credential helper.
  const path = [join(nvm, 'bin'), join(home, '.cargo/bin'), join(pyenv, 'shims'), join(pyenv, 'bin'), join(home, '.local/bin'), join(home, 'go/bin')];
  write(join(home, '.profile'), '[ -n "$BASH" ] && [ -f ~/.bashrc ] && . ~/.bashrc\n');
  write(join(home, '.bashrc'), `export GH_TOKEN=${SECRETS.profile}\nexport PATH="${path.join(':')}:$PATH"\necho "pyenv: cannot rehash: ${pyenv}/shims isn't writable"\n`);
  write(
    join(home, '.gitconfig'),
    `[user]\n\tname = Dev Person\n\temail = dev@example.com\n[url "https://x-access-token:${SECRETS.gitUrl}@github.com/"]\n\tinsteadOf = https://github.com/\n[credential]\n\thelper = store\n`,
  );
  write(join(home, '.git-credentials'), `https://u:${SECRETS.gitUrl}@github.com\n`);
}

describe("a developer's home: no dotfile as it is, toolchains without their neighbours", () => {
  it('the profile token, git url token and every secret beside nvm, cargo, ~/.local and ~/go stay unread; node, npm, cargo (a build), python via pyenv and a pipx tool run; commits carry the user identity', async () => {
    h = await setup({ repo: { agents: agentsWithTools(['Bash', 'Read']) }, state: ROLE_STATE, bodies: ROLE_BODIES });
    const home = join(h.scratch, 'home');
    developerHome(home);
    Object.assign(h.config.env, { HOME: home, SHELL: '/bin/bash', PATH: '/usr/local/bin:/usr/bin:/bin' });
    const { result, results, out } = await agentRuns(h, 'implementor', [
      'echo "gh=[$GH_TOKEN]"; env | grep -c ghp_ || true',
      'git config --list --show-origin; cat ~/.gitconfig ~/.git-credentials 2>&1; echo end',
      'ls -A ~',
      'node -v && npm -v',
      'cargo --version && rustc --version',
      '(cd /tmp && cargo new -q --vcs none hello && cd hello && cargo run -q --offline)',
      'python --version',
      'hello',
      'gotool',
      `cat ${home}/.nvm/versions/node/v20.0.0/etc/npmrc ~/.cargo/config.toml ~/.cargo/credentials.toml ~/.local/share/fish/fish_history ~/.local/share/someapp/auth.json ~/go/src/github.com/other/repo/secret.txt ~/.bashrc ~/.profile 2>&1; ls ~/.local/share ~/go 2>&1; echo end`,
      'echo x > f.txt && git add -A && git commit -qm "agent work" && git log -1 --format="%an <%ae>" && git config --global user.email',
    ]);
    const everything = out.join('\n');
    for (const [what, secret] of Object.entries(SECRETS)) expect(everything, what).not.toContain(secret);
    for (const [i, r] of results.entries()) expect(r.is_error, `command ${i}: ${out[i]}`).toBe(false);
    expect(out[0]).toBe('gh=[]\n0');
    expect(out[1]).toContain('user.name=Dev Person');
    expect(out[1]).not.toMatch(/insteadof|credential\.helper/i);
    expect(out[2].split('\n').sort()).not.toEqual(expect.arrayContaining(['.bashrc']));
    expect(out[2]).not.toMatch(/\.bashrc|\.profile|\.git-credentials/);
    expect(out[3]).toMatch(new RegExp(`^${process.version}\\n\\d+\\.\\d+\\.\\d+$`));
    expect(out[4]).toMatch(/^cargo \d+\.\d+\.\d+.*\nrustc \d+\.\d+\.\d+/);
    expect(out[5]).toBe('Hello, world!');
    expect(out[6]).toMatch(/^Python 3\.\d+\.\d+$/);
    expect(out[7]).toBe(`hello from ${home}/.local/share/pipx/venvs/hello`);
    expect(out[8]).toBe('gotool ran');
    expect(out[9]).toMatch(/No such file or directory/);
    // nothing printed by the profile reaches the agent's commands
    for (const o of out) expect(o).not.toMatch(/cannot rehash/);
    // the repository's own identity (copied into the clone) signs; the user's global one is there
    expect(out[10]).toBe(`${git(h.repo.root, 'log', '-1', '--format=%an <%ae>')}\ndev@example.com`);
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('+++ b/f.txt');
    for (const secret of Object.values(SECRETS)) expect(result.patch).not.toContain(secret);
    expect(existsSync(join(home, '.bashrc'))).toBe(true);
  }, 180_000);
});

// A restarted engine's first session waited for the user's login profile (~0.3 s here: issue
// 37's restart figure); the adapter now reads it when it is made, once per process.
describe("the user's login profile", () => {
  it('is read once, when the adapter is made: its PATH reaches the first session, which does not run it again', async () => {
    h = await setup({ repo: { agents: agentsWithTools(['Bash']) }, state: ROLE_STATE, bodies: ROLE_BODIES });
    const home = join(h.scratch, 'home');
    const runs = join(h.scratch, 'profile-runs');
    write(join(home, 'tools/profiled'), '#!/bin/sh\necho profiled tool ran\n', 0o755);
    write(join(home, '.profile'), `echo run >> ${runs}\nexport PATH="${join(home, 'tools')}:$PATH"\n`);
    Object.assign(h.config.env, { HOME: home, SHELL: '/bin/bash', PATH: '/usr/local/bin:/usr/bin:/bin' });
    const adapter = h.adapter();
    const ran = () => (existsSync(runs) ? readFileSync(runs, 'utf8').split('\n').filter(Boolean).length : 0);
    for (const t0 = Date.now(); ran() === 0 && Date.now() - t0 < 15_000; ) await new Promise((r) => setTimeout(r, 50));
    expect(ran()).toBe(1);
    const { out } = await agentRuns(h, 'planner', ['profiled'], { adapter });
    expect(out[0]).toBe('profiled tool ran');
    expect(ran()).toBe(1);
  }, 120_000);
});

describe('the sandbox itself', () => {
  it('no user namespace can be made inside (unshare -Ur fails); the proxy and relay sockets cannot be replaced or added to; the session still reaches the model through them', async () => {
    h = await setup({ repo: { agents: agentsWithTools(['Bash']) }, state: ROLE_STATE, bodies: ROLE_BODIES });
    const { result, out } = await agentRuns(h, 'planner', [
      'unshare -Ur id 2>&1; echo "rc=$?"',
      'unshare -U --map-root-user sh -c "cat /proc/self/status | grep CapEff" 2>&1; echo "rc=$?"',
      'd=/run/claude-runtime-adapter; ls $d; rm -f $d/egress.sock 2>&1; touch $d/planted 2>&1; ls $d',
    ]);
    expect(out[0]).toMatch(/unshare failed[\s\S]*rc=1$/);
    expect(out[0]).not.toMatch(/uid=0/);
    expect(out[1]).toMatch(/rc=1$/);
    expect(out[1]).not.toMatch(/CapEff:\s+0*[1-9a-f]/);
    const [before, ...rest] = out[2].split('rm: ');
    expect(before.trim().split('\n')).toEqual(expect.arrayContaining(['egress.sock', 'model.sock']));
    expect(rest.join('')).toMatch(/Read-only file system[\s\S]*touch: [\s\S]*Read-only file system/);
    expect(out[2].trim().split('\n').at(-1)).not.toBe('planted');
    expect(out[2]).not.toContain('\nplanted');
    expect(result.create).toEqual([]);
  });
});
