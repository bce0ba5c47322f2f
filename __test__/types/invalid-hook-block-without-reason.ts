// @expect TS2322 — 'block' needs a reason.
import type { BashValidatorHook } from 'claude-runtime-adapter';
export const hook: BashValidatorHook = async () => ({ decision: 'block' });
