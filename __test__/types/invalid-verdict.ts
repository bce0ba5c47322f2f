// @expect TS2367 — the verdicts are 'approve' | 'needs-changes'.
import type { ReviewerResult } from 'claude-runtime-adapter';
declare const result: ReviewerResult;
export const rejected = result.review.verdict === 'reject';
