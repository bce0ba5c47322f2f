// @expect TS2322 — providers return promises.
import type { RuntimeAdapterDeps } from 'claude-runtime-adapter';
declare const deps: RuntimeAdapterDeps;
export const bad: RuntimeAdapterDeps = { ...deps, workItemReader: { getWorkItemBody: (id: string) => id } };
