// Helpers shared by the benchmarks: statistics, /proc inspection, memory, machine conditions.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, totalmem, freemem, release } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { engineState, RevisionProvider, WorkItemProvider } from '../../__test__/support/harness.mjs';

export const BENCH_DIR = join(dirname(fileURLToPath(import.meta.url)), '..');
export const ROOT = join(BENCH_DIR, '..');
export const MiB = 1024 * 1024;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The bench's option `--name=value` from its command line, else `dflt`. */
export const arg = (name, dflt) => {
  const a = process.argv.find((x) => x.startsWith(`--${name}=`));
  return a ? a.slice(name.length + 3) : dflt;
};
/** A numeric option (a count, a size, seconds): `--name=value` as a number, else `dflt`. */
export const numberArg = (name, dflt) => Number(arg(name, dflt));

/** Nearest-rank percentile (p in 0..100) of numbers; null when empty. */
export function percentile(values, p) {
  const v = values.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const rank = Math.max(1, Math.ceil((p / 100) * v.length));
  return v[rank - 1];
}
export const median = (values) => {
  const v = values.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};
export const summary = (values) => ({ n: values.filter((x) => Number.isFinite(x)).length, median: median(values), p95: percentile(values, 95), min: percentile(values, 0), max: percentile(values, 100) });

function procStat(pid) {
  // fields after the `comm` (which may hold spaces/parens): state is [0], ppid is [1]
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return s.slice(s.lastIndexOf(')') + 2).split(' ');
}

/** Live (not zombie) processes: [{ pid, ppid, cmd }]. */
export function liveProcesses() {
  const out = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const [state, ppid] = procStat(d);
      if (state === 'Z' || state === 'X') continue;
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8').replace(/\0/g, ' ');
      out.push({ pid: Number(d), ppid: Number(ppid), cmd });
    } catch {
      // exited while we looked
    }
  }
  return out;
}

/** Live processes whose command line contains `marker`. */
export const processesWith = (marker) => liveProcesses().filter((p) => p.cmd.includes(marker) && p.pid !== process.pid);

/** Is `pid` alive (exists and is not a zombie)? */
export function alive(pid) {
  try {
    const [state] = procStat(pid);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Direct children of this process whose command line contains `needle`. */
export const childrenWith = (needle) => liveProcesses().filter((p) => p.ppid === process.pid && p.cmd.includes(needle));

export function gc() {
  if (typeof globalThis.gc === 'function') {
    globalThis.gc();
    globalThis.gc();
  }
}

/** VmRSS / VmHWM of this process, bytes. */
export function procMemory(pid = 'self') {
  const s = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(s)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
}

export function machine() {
  const c = cpus();
  return {
    at: new Date().toISOString(),
    node: process.version,
    kernel: release(),
    cpus: c.length,
    cpuModel: c[0]?.model,
    totalMemMiB: Math.round(totalmem() / MiB),
    freeMemMiB: Math.round(freemem() / MiB),
    loadavg: loadavg().map((x) => Math.round(x * 100) / 100),
  };
}

/** Writes `data` as bench/results/<name>-<timestamp>.json and returns the path. */
export function saveResults(name, data) {
  const dir = join(BENCH_DIR, 'results');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${name}-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, JSON.stringify(data, null, 2));
  return file;
}

/** A logger that drops everything (the engine's logger would not print in a benchmark). */
export const quietLogger = { debug() {}, info() {}, warn() {}, error() {} };

const pad = (s, n) => String(s).padEnd(n);
/** Prints rows (arrays of cells) as an aligned table. */
export function printTable(header, rows) {
  const all = [header, ...rows].map((r) => r.map((c) => (c == null ? '-' : String(c))));
  const widths = header.map((_, i) => Math.max(...all.map((r) => r[i].length)));
  const line = (r) => r.map((c, i) => pad(c, widths[i])).join('  ');
  console.log(line(all[0]));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const r of all.slice(1)) console.log(line(r));
}

export const fmtMs = (x) => (x == null ? null : `${x.toFixed(x < 10 ? 2 : 1)} ms`);
export const fmtMiB = (x) => (x == null ? null : `${(x / MiB).toFixed(2)} MiB`);
export const ratio = (a, b) => (a == null || b == null || b === 0 ? null : `${(a / b).toFixed(2)}x`);

/** `adapter` kept in `live` (what an interrupted bench shuts down) until its shutdown; the
 * warnings and errors it logged to `logger` (a recording logger). */
export function tracked(adapter, logger, live) {
  live.add(adapter);
  return {
    adapter,
    logger,
    async shutdown() {
      live.delete(adapter);
      await adapter.shutdown();
    },
    /** Warnings the adapter logged (e.g. that Implementors fall back to full clones). */
    warnings: () => logger.entries.filter((e) => e.level === 'warn' || e.level === 'error').map((e) => e.message),
  };
}

/** Removes `p`, also an overlayfs `work/work` left with mode 000 (unprivileged runs). */
export function rmrf(p) {
  try {
    rmSync(p, { recursive: true, force: true });
  } catch {
    try {
      execFileSync('chmod', ['-R', 'u+rwx', p], { stdio: 'ignore' });
      rmSync(p, { recursive: true, force: true });
    } catch (err) {
      console.error(`could not remove ${p}: ${err.message}`);
    }
  }
}

/** The engine's deps for a bench: open work items `items`, each with the body `bodyOf(id)`. */
export function benchDeps(items, bodyOf) {
  return () => ({
    workItemReader: new WorkItemProvider(Object.fromEntries(items.map((id) => [id, bodyOf(id)]))),
    revisionReader: new RevisionProvider({}),
    getState: () => engineState({ workItems: items.map((id) => ({ id, title: `Item ${id}`, status: 'open', linkedRevision: null })) }),
    getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
  });
}

/** A cleanup that runs once however often it is called: the live adapters shut down, the fake
 * API closed, the temp dirs removed (last made first). */
export function cleanupOnce(live, api, temps) {
  let cleaning = null;
  return () => {
    cleaning ??= (async () => {
      for (const a of live) await a.shutdown().catch((e) => console.error(`shutdown: ${e.message}`));
      live.clear();
      await api.close().catch(() => {});
      for (const t of temps.reverse()) rmrf(t);
    })();
    return cleaning;
  };
}
