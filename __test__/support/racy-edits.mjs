// Issue 26: same-size edits of a tracked file, through the agent's own tools — the work git's
// stat cache alone would judge unchanged (see src/git/patch.rs). Shared by the local suite
// (racy-edit.test.mjs) and the Kubernetes one (kube/sessions.test.mjs), so both backends run
// the same cases and their patches can be compared byte for byte.
import { toolUse } from './fake-api.mjs';
import { agentsWithTools } from './repo.mjs';

/** How often each case runs: it lost the work 3 times in 20 before the fix. */
export const RACY_RUNS = 20;

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

/** The one change every case's patch holds. */
export const RACY_CHANGE = '-export const answer = 42;\n+export const answer = 43;\n';

/** Resolves just after the wall clock passes a whole second: the session's checkout and the
 * agent's first edit then most likely share their second, as when the work was lost. */
export const atTheStartOfASecond = () => new Promise((r) => setTimeout(r, 1005 - (Date.now() % 1000)));
