// @expect TS2322 — the state's maps hold WorkItems, not strings.
import type { RuntimeAdapterDeps } from 'claude-runtime-adapter';
declare const deps: RuntimeAdapterDeps;
export const bad: RuntimeAdapterDeps = {
  ...deps,
  getState: () => ({ workItems: new Map([['w1', 'not a work item']]), revisions: new Map(), lastPlannedSHAs: new Map() }),
};
