// Issue 26: same-size edits of a tracked file, through the agent's own tools — the work git's
// stat cache alone would judge unchanged (see src/git/patch.rs). Shared by the local suite
// (racy-edit.test.mjs) and the Kubernetes ones (kube/sessions, node-base and warm-pods), so both
// backends run the same cases and their patches can be compared byte for byte.
import { toolUse } from './fake-api.mjs';
import { agentsWithTools } from './repo.mjs';

/** How often a case runs in a loop: the work was lost 3 times in 20 before the fix. */
export const RACY_RUNS = 20;

/**
 * How often `npm test` and `npm run test:kube` run each of RACY_CASES. Those meet git's racy
 * second only by chance (see RACY_SECOND_CASES): their loops of RACY_RUNS caught nothing the
 * first runs would not, so the loops run in `npm run test:loops` (CRA_TEST_RACY_LOOPS=1), and
 * the case that meets the second for sure runs RACY_RUNS times everywhere.
 */
export const RACY_CHANCE_RUNS = process.env.CRA_TEST_RACY_LOOPS === '1' ? RACY_RUNS : 5;

export const RACY_REPO = {
  agents: agentsWithTools(['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep']),
  files: { 'src/index.js': 'export const answer = 42;\n' },
};

const SAME_SIZE = "printf 'export const answer = 43;\\n' > src/index.js";
const bash = (command) => toolUse('Bash', { command, description: 'edit' });

/**
 * name → the agent's tool calls, given the session's working directory (the file tools take
 * absolute paths). Each rewrites `src/index.js` with content of the same size.
 */
export const RACY_CASES = {
  'a Bash printf in the second of the checkout': () => [bash(SAME_SIZE)],
  'the Write tool': (cwd) => [
    toolUse('Read', { file_path: `${cwd}/src/index.js` }),
    toolUse('Write', { file_path: `${cwd}/src/index.js`, content: 'export const answer = 43;\n' }),
  ],
  'the Edit tool': (cwd) => [
    toolUse('Read', { file_path: `${cwd}/src/index.js` }),
    toolUse('Edit', { file_path: `${cwd}/src/index.js`, old_string: 'answer = 42', new_string: 'answer = 43' }),
  ],
  'a Bash edit back-dated with touch -d': () => [bash(`m=$(stat -c %Y src/index.js) && ${SAME_SIZE} && touch -m -d @$m src/index.js`)],
  'a same-size edit then git add, not committed': () => [bash(`${SAME_SIZE} && git add src/index.js`)],
  // Which `git add -A` obeys: the extraction must clear the mark first (a pod's decides so by
  // listing the index's tags).
  'a same-size edit of a file marked assume-unchanged': () => [bash(`git update-index --assume-unchanged src/index.js && ${SAME_SIZE}`)],
};

// The cases above meet git's racy second only by chance: the checkout is made before the CLI
// starts, and the agent's first edit comes a CLI start later (0.5-4 s, the machine's load
// deciding). With extraction's stat limit undone (src/git/patch.rs: the index copy given a new
// mtime, the fault that lost the work), all 240 runs of the six cases, layers and clones, still
// passed on a busy machine, twice. This one makes the second certain: the agent checks the file
// out again (git writes it and records its stat data in the index) and rewrites it with the same
// size in the same command, so entry, file and index share one second unless a second boundary
// falls within the milliseconds between them. With the limit undone it lost the work in 13, 19
// and 18 of 20 runs (layers, layers, clones). The same through the Write and Edit tools, a
// Read's model turn after the checkout, lost nothing in 20 (the turns outlast the second), so
// they are not here: tests/racy_edit.rs holds the checkout's second for sure at the git level.
export const RACY_SECOND_CASES = {
  'a Bash printf in the second the file was checked out again': () => [bash(`rm src/index.js && git checkout -- src/index.js && ${SAME_SIZE}`)],
};

/** Every case as [name, the agent's tool calls given its working directory, runs]. */
export const racyCases = () => [
  ...Object.entries(RACY_CASES).map(([name, calls]) => [name, calls, RACY_CHANCE_RUNS]),
  ...Object.entries(RACY_SECOND_CASES).map(([name, calls]) => [name, calls, RACY_RUNS]),
];

/** The one change every case's patch holds. */
export const RACY_CHANGE = '-export const answer = 42;\n+export const answer = 43;\n';

/** Resolves just after the wall clock passes a whole second: the session's checkout and the
 * agent's first edit then most likely share their second, as when the work was lost. */
export const atTheStartOfASecond = () => new Promise((r) => setTimeout(r, 1005 - (Date.now() % 1000)));

/**
 * Runs `run(0)` … `run(runs - 1)`, at most `atOnce` at a time: each next run starts as soon as
 * one ends (batches would wait for their slowest). Resolves when all have ended; `run` reports
 * its own failures (it must not reject).
 */
export async function pooled(runs, atOnce, run) {
  let next = 0;
  const worker = async () => {
    while (next < runs) await run(next++);
  };
  await Promise.all(Array.from({ length: Math.min(atOnce, runs) }, worker));
}
