// One session per role on a shared engine state: the params and the final answer of each, for
// suites that try a boundary with every role (sandbox, file tools).
import { structured } from './fake-api.mjs';
import { engineState } from './harness.mjs';

/** Work item 1 (open, for the Implementor) and 7 (in review of revision r1, for the Reviewer). */
export const ROLE_STATE = engineState({
  workItems: [
    { id: '1', title: 'Item', status: 'open', linkedRevision: null },
    { id: '7', title: 'Reviewed', status: 'in-review', linkedRevision: 'r1' },
  ],
  revisions: [{ id: 'r1', title: 'PR 1', pipeline: null }],
});
export const ROLE_BODIES = { 1: 'Body', 7: 'Body' };

/** `params(branchName?)` starts the role's session; `done` is its valid structured answer. */
export const ROLES = {
  implementor: { params: (branchName = 'wi-1') => ({ role: 'implementor', workItemID: '1', branchName }), done: structured({ role: 'implementor', outcome: 'completed', summary: 'done' }) },
  planner: { params: () => ({ role: 'planner', specPaths: [] }), done: structured({ role: 'planner', create: [], close: [], update: [] }) },
  reviewer: { params: () => ({ role: 'reviewer', workItemID: '7', revisionID: 'r1' }), done: structured({ role: 'reviewer', review: { verdict: 'approve', summary: 'ok', comments: [] } }) },
};

/** One in-progress work item 7 for Implementor suites (session, transcript): state, params, answer. */
export const implementorState = engineState({
  workItems: [{ id: '7', title: 'Add a file', status: 'in-progress', linkedRevision: null }],
});
export const implementorParams = { role: 'implementor', workItemID: '7', branchName: 'wi-7' };
export const implementorDone = (summary = 'done') => structured({ role: 'implementor', outcome: 'completed', summary });
