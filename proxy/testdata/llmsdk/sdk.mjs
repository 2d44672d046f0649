// sdk.mjs drives the official OpenAI and Anthropic SDKs through
// governor-proxy, one scenario per run, and prints what it saw as JSON lines
// for proxy/metering_sdk_test.go to check. The SDKs are configured as a
// user would, one of two ways:
//
//   - SIDECAR set: a base URL pointing at the sidecar's routes, and the
//     subtask's name in Proxy-Authorization;
//   - SIDECAR unset: no configuration at all (the key from OPENAI_API_KEY and
//     ANTHROPIC_API_KEY, the providers' own URLs); the environment sends
//     them through the sidecar (HTTPS_PROXY, whose username is the subtask,
//     with env-proxy.cjs preloaded) and trusts its interception CA
//     (NODE_EXTRA_CA_CERTS).
//
//	node sdk.mjs SCENARIO   (AGENTS: the sub-agents, comma-separated)
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.env.SIDECAR;
const agents = (process.env.AGENTS || 'agent-0,agent-1,agent-2').split(',');
const out = (v) => process.stdout.write(JSON.stringify(v) + '\n');

function clients(agent) {
  if (!base) return { openai: new OpenAI(), anthropic: new Anthropic() };
  const defaultHeaders = agent ? { 'Proxy-Authorization': 'Basic ' + Buffer.from(agent + ':').toString('base64') } : {};
  return {
    openai: new OpenAI({ apiKey: 'sk-test', baseURL: base + '/openai', defaultHeaders }),
    anthropic: new Anthropic({ apiKey: 'sk-ant-test', baseURL: base + '/anthropic', defaultHeaders }),
  };
}

const messages = (n) => [{ role: 'user', content: 'x'.repeat(n) }];

// Every kind of call once: JSON and streamed, chat completions, responses
// and messages. A stream that did not ask for usage must show none.
async function everyKind(agent) {
  const { openai, anthropic } = clients(agent);
  let calls = 0;
  await openai.chat.completions.create({ model: 'gpt-4o-mini', max_tokens: 100, messages: messages(20) });
  calls++;
  const chat = await openai.chat.completions.create({ model: 'gpt-4o-mini', stream: true, messages: messages(30) });
  let text = '';
  for await (const chunk of chat) {
    if ('usage' in chunk) throw new Error('a stream that did not ask for usage got ' + JSON.stringify(chunk));
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  if (text !== 'Hello from the fake provider.') throw new Error('chat stream text: ' + text);
  calls++;
  const withUsage = await openai.chat.completions.create({ model: 'gpt-4o-mini', stream: true, stream_options: { include_usage: true }, messages: messages(5) });
  let usage = null;
  for await (const chunk of withUsage) if (chunk.usage) usage = chunk.usage;
  if (!usage || !usage.total_tokens) throw new Error('include_usage: no usage chunk');
  calls++;
  const r = await openai.responses.create({ model: 'gpt-4.1', input: 'hi', max_output_tokens: 30 });
  if (!r.usage?.total_tokens) throw new Error('responses: no usage');
  calls++;
  const rs = await openai.responses.create({ model: 'gpt-4.1', input: 'hi there', stream: true });
  for await (const ev of rs) void ev;
  calls++;
  const m = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: messages(40) });
  if (!m.usage?.cache_read_input_tokens && m.usage?.cache_read_input_tokens !== 0) throw new Error('messages: no cache tokens');
  calls++;
  const ms = anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: messages(50) });
  const final = await ms.finalMessage();
  if (final.usage.output_tokens <= 0) throw new Error('messages stream: no output usage');
  calls++;
  return calls;
}

// Calls until refused; the refusal must be the SDK's rate-limit error.
async function untilRefused(agent, i) {
  const { openai, anthropic } = clients(agent);
  let calls = 0;
  for (;;) {
    try {
      if (i === 2) {
        if (calls % 2) await anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 200, messages: messages(100) }).finalMessage();
        else await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 200, messages: messages(100) });
      } else if (calls % 2) {
        const s = await openai.chat.completions.create({ model: 'gpt-4o-mini', max_tokens: 200, stream: true, messages: messages(60 * i) });
        for await (const c of s) void c;
      } else {
        await openai.chat.completions.create({ model: 'gpt-4o-mini', max_tokens: 200, messages: messages(60 * i) });
      }
      calls++;
    } catch (err) {
      return { agent, calls, error: err.constructor.name, status: err.status ?? 0, message: String(err.message) };
    }
  }
}

const scenarios = {
  async exact() {
    const calls = await Promise.all(agents.map(everyKind));
    out({ calls: calls.reduce((a, b) => a + b, 0) });
  },
  async budget() {
    out({ agents: await Promise.all(agents.map(untilRefused)) });
  },
  // One line per piece the SDK hands out, written at once: the test lets
  // the fake send the next piece only after it reads the line.
  async stream() {
    const { openai, anthropic } = clients('');
    const chat = await openai.chat.completions.create({ model: 'gpt-4o-mini', stream: true, messages: messages(3) });
    let i = 0;
    for await (const chunk of chat) out({ api: 'openai', chunk: i++, finish: chunk.choices[0]?.finish_reason ?? null });
    const msgs = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, stream: true, messages: messages(3) });
    for await (const ev of msgs) out({ api: 'anthropic', event: ev.type });
    out({ done: true });
  },
  // Calls that name no output limit (OpenAI) or a large one (Anthropic,
  // which requires one), under a budget smaller than either estimate: with
  // on_over_estimate: clamp they go ahead, the limit lowered.
  async clamp() {
    const { openai, anthropic } = clients('');
    const seen = [];
    const o = await openai.chat.completions.create({ model: 'gpt-4o-mini', messages: messages(20) }).withResponse();
    seen.push({ api: 'openai', clamped: o.response.headers.get('governor-clamped'), tokens: o.data.usage.total_tokens });
    const a = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8192, messages: messages(20) }).withResponse();
    const u = a.data.usage;
    seen.push({ api: 'anthropic', clamped: a.response.headers.get('governor-clamped'),
      tokens: u.input_tokens + u.output_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0) });
    out({ clamped: seen });
  },
  async deny() {
    const { openai, anthropic } = clients('');
    const seen = [];
    for (const call of [
      () => openai.chat.completions.create({ model: 'gpt-4o-mini', max_tokens: 5000, messages: messages(3) }),
      () => anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 5000, messages: messages(3) }),
    ]) {
      try {
        await call();
        seen.push({ error: 'none' });
      } catch (err) {
        seen.push({ error: err.constructor.name, status: err.status ?? 0, type: err.error?.type ?? err.type ?? '', message: String(err.message) });
      }
    }
    out({ denials: seen });
  },
};

const name = process.argv[2];
if (!scenarios[name]) {
  console.error('usage: node sdk.mjs ' + Object.keys(scenarios).join('|'));
  process.exit(2);
}
scenarios[name]().catch((err) => {
  console.error(err);
  process.exit(1);
});
