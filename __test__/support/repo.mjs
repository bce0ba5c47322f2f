// Throw-away git repositories shaped like the projects the adapter runs agents in.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

const git = (root, ...args) => execFileSync('git', args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] }).toString();

const DEFAULT_AGENTS = {
  planner: { description: 'Plans work items from specs', tools: ['Read', 'Glob', 'Grep'], prompt: 'You are the planner.' },
  implementor: {
    description: 'Implements one work item',
    tools: ['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep'],
    prompt: 'You are the implementor.',
  },
  reviewer: { description: 'Reviews a revision', tools: ['Read', 'Glob', 'Grep'], prompt: 'You are the reviewer.' },
};

/** Definitions that give every role the same `tools` (a boundary must hold whatever a definition grants). */
export function agentsWithTools(tools) {
  return Object.fromEntries(['planner', 'implementor', 'reviewer'].map((name) => [name, { description: name, tools, prompt: `You are the ${name}.` }]));
}

/** The text of an agent definition file: YAML frontmatter + prompt body. */
export function agentFile({ name, description, tools, model, maxTurns, prompt = '' }) {
  const lines = ['---', `name: ${name}`, `description: ${JSON.stringify(description ?? name)}`];
  if (tools) lines.push(`tools: ${tools.join(', ')}`);
  if (model) lines.push(`model: ${model}`);
  if (maxTurns != null) lines.push(`maxTurns: ${maxTurns}`);
  lines.push('---', '', prompt, '');
  return lines.join('\n');
}

/**
 * A git repo in a temp dir: branch `main`, identity configured in the repo, one initial commit.
 * @param {object} [opts]
 * @param {Record<string, {description?, tools?, model?, maxTurns?, prompt?}> | false} [opts.agents]
 *   agent definitions written to .claude/agents/<name>.md (default: planner, implementor, reviewer;
 *   `false` writes none)
 * @param {Record<string, string>} [opts.files] more files, path relative to the root → content
 * @param {string | null} [opts.claudeMd] content of .claude/CLAUDE.md (null: none)
 * @returns {{ root: string, cleanup(): void, git(...args: string[]): string }}
 */
export function makeTempRepo({ agents = DEFAULT_AGENTS, files = {}, claudeMd = '# Project\n\nTest repository.\n' } = {}) {
  const root = mkdtempSync(join(tmpdir(), 'cra-repo-'));
  const write = (rel, content) => {
    const p = join(root, rel);
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, content);
  };
  try {
    git(root, 'init', '-q', '-b', 'main');
    git(root, 'config', 'user.name', 'Test User');
    git(root, 'config', 'user.email', 'test@example.invalid');
    git(root, 'config', 'commit.gpgsign', 'false');
    write('README.md', '# temp repo\n');
    for (const [name, def] of Object.entries(agents || {})) write(`.claude/agents/${name}.md`, agentFile({ name, ...def }));
    if (claudeMd != null) write('.claude/CLAUDE.md', claudeMd);
    for (const [rel, content] of Object.entries(files)) write(rel, content);
    git(root, 'add', '-A');
    git(root, 'commit', '-q', '-m', 'initial commit');
  } catch (err) {
    rmSync(root, { recursive: true, force: true });
    throw err;
  }
  return {
    root,
    git: (...args) => git(root, ...args),
    cleanup() {
      rmSync(root, { recursive: true, force: true });
    },
  };
}
