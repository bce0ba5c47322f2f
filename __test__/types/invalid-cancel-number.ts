// @expect TS2345 — session ids are strings.
import type { RuntimeAdapter } from 'claude-runtime-adapter';
declare const adapter: RuntimeAdapter;
adapter.cancelAgent(42);
