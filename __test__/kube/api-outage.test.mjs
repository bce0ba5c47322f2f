// Issue 34 on the Kubernetes backend: the pods' model requests reach the engine's relay, which
// holds them through an API outage; a CLI that ended on an API failure is resumed on its
// conversation in the same pod. The real CLI in the session image, the fake API on 127.0.0.1.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { apiError, bash, reply, scenario } from '../support/fake-api.mjs';
import { collect, setup } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { implementorDone, implementorParams, implementorState } from '../support/roles.mjs';
import { adapterPods, kubeBackend } from './support.mjs';

const OUTAGE_MS = Number(process.env.CRA_TEST_OUTAGE_MS ?? 60_000);

/** A harness for one test, cleaned up when `body` is done (the tests run concurrently). */
async function withSetup(script, body) {
  const h = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: { backend: kubeBackend() } });
  try {
    await body(h);
  } finally {
    await h.cleanup();
  }
}

/** Down (`down(o)`) from the first request after the work step until `OUTAGE_MS` later. */
function outageScript(work, down) {
  const outage = { start: null, downReplies: 0 };
  const script = scenario.steps([
    reply(bash(work)),
    () => {
      outage.start ??= Date.now();
      if (Date.now() - outage.start < OUTAGE_MS) {
        outage.downReplies += 1;
        return down(outage);
      }
      return implementorDone('finished after the outage');
    },
  ]);
  return { script, outage };
}

const pods = (transcript) => [...new Set([...transcript.matchAll(/Kubernetes pod (\S+) of image/g)].map((m) => m[1]))];

describe('a session in a pod survives an API outage', () => {
  it.concurrent(`an outage of ${OUTAGE_MS / 1000} s after the Implementor committed: the engine's relay holds the pod's request and the session completes with the work`, { timeout: OUTAGE_MS + 180_000 }, async () => {
    const { script, outage } = outageScript('echo committed > a.txt && git add -A && git commit -qm a && echo ok', () => apiError(529, 'Overloaded'));
    await withSetup(script, async (h) => {
      const handle = await h.adapter().startAgent(implementorParams);
      const [result, stats] = await Promise.all([handle.result, handle.stats]);
      expect(result.outcome).toBe('completed');
      expect(result.patch).toContain('+++ b/a.txt');
      expect(outage.downReplies).toBeGreaterThan(1);
      expect(stats.api.retries).toBe(outage.downReplies);
      expect(stats.api.resumes).toBe(0);
      expect(adapterPods(handle.sessionID)).toEqual([]);
    });
  });

  it.concurrent(`a request dropped without an answer, then the API down for ${OUTAGE_MS / 1000} s: the CLI is resumed on its conversation in the same pod and completes with the work`, { timeout: OUTAGE_MS + 180_000 }, async () => {
    const { script, outage } = outageScript('echo kept > c.txt && echo ok', (o) => (o.downReplies === 1 ? { cut: true } : apiError(529, 'Overloaded')));
    await withSetup(script, async (h) => {
      const handle = await h.adapter().startAgent(implementorParams);
      const [result, stats, out] = await Promise.all([handle.result, handle.stats, collect(handle.output)]);
      expect(result.outcome).toBe('completed');
      expect(result.patch).toContain('+++ b/c.txt');
      expect(stats.api.resumes).toBe(1);
      expect(out).toMatch(/continuing its conversation/);
      const resumed = JSON.stringify(h.api.mainBodies().at(-1).messages);
      expect(resumed).toContain('echo kept > c.txt');
      expect(resumed).toContain('has been resumed');
      // One pod for both runs of the CLI, and its conversation kept beside the transcript.
      expect(pods(readFileSync(handle.logFilePath, 'utf8'))).toHaveLength(1);
      const conversation = readFileSync(handle.logFilePath.replace(/\.[^./]+$/, '.conversation.jsonl'), 'utf8');
      expect(conversation).toContain('echo kept > c.txt');
      expect(adapterPods(handle.sessionID)).toEqual([]);
    });
  });

  it.concurrent(`an overload reported inside the stream (200, message_start, overloaded_error) for ${OUTAGE_MS / 1000} s after the work: held by the engine's relay like a 529, and the session in its pod completes with the work`, { timeout: OUTAGE_MS + 180_000 }, async () => {
    const { script, outage } = outageScript('echo streamed > s.txt && git add -A && git commit -qm s && echo ok', () => ({ streamError: { type: 'overloaded_error', message: 'Overloaded' } }));
    await withSetup(script, async (h) => {
      const handle = await h.adapter().startAgent(implementorParams);
      const [result, stats] = await Promise.all([handle.result, handle.stats]);
      expect(result.outcome).toBe('completed');
      expect(result.patch).toContain('+++ b/s.txt');
      expect(outage.downReplies).toBeGreaterThan(1);
      expect(stats.api.retries).toBe(outage.downReplies);
      expect(stats.api.resumes).toBe(0);
      expect(adapterPods(handle.sessionID)).toEqual([]);
    });
  });
});
