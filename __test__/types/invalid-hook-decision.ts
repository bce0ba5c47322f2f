// @expect TS2322 — a hook answers 'approve' or 'block' (with a reason), nothing else.
import type { BashValidatorHook } from 'claude-runtime-adapter';
export const hook: BashValidatorHook = async () => ({ decision: 'deny' });
