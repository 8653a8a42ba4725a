// The JS agents SDK's realtime session (@openai/agents-realtime) against a running hark:
// an agent with a remote MCP server (hostedMcpTool), a function tool and, when asked, a
// stored prompt asks the questions it is given one after another, each once its answer
// has come, and writes every server event it saw and every error to stdout as JSON lines.
//
// Environment: HARK_WS (ws://HOST:PORT/v1/realtime?model=…), HARK_KEY, MCP_URL,
// MCP_HEADER (name=value), QUESTIONS (a JSON list), PROMPT_ID (optional).
import { RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';
import { hostedMcpTool } from '@openai/agents-core';
import { z } from 'zod';

const [headerName, headerValue] = process.env.MCP_HEADER.split('=');
const getTime = tool({
  name: 'get_time',
  description: 'The time in a city.',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => `noon in ${city}`,
});
const town = hostedMcpTool({
  serverLabel: 'town',
  serverUrl: process.env.MCP_URL,
  headers: { [headerName]: headerValue },
  requireApproval: 'never',
});
const agent = new RealtimeAgent({
  name: 'Concierge',
  tools: [town, getTime],
  ...(process.env.PROMPT_ID ? { prompt: { promptId: process.env.PROMPT_ID } } : {}),
});
const session = new RealtimeSession(agent, {
  transport: 'websocket',
  model: 'gpt-realtime',
  config: { outputModalities: ['text'], audio: { input: { turnDetection: null } } },
});

const out = (record) => process.stdout.write(`${JSON.stringify(record)}\n`);
let answered = null;
session.on('error', (error) => {
  out({ kind: 'error', error: String(error?.error?.message ?? error?.error ?? error) });
});
session.transport.on('*', (event) => {
  out({ kind: 'event', event });
  if (event.type !== 'response.done' || !answered) return;
  const texts = event.response.output.filter((o) => o.type === 'message');
  if (texts.length) answered();
});

const listed = new Promise((resolve) => session.on('mcp_tools_changed', resolve));
await session.connect({ apiKey: process.env.HARK_KEY, url: process.env.HARK_WS });
await listed;
for (const question of JSON.parse(process.env.QUESTIONS)) {
  const answer = new Promise((resolve) => {
    answered = resolve;
  });
  session.sendMessage(question);
  await answer;
}
// One question more, answered without tools: a second answer to an earlier question (what
// a response that went on after its MCP call caused) would come before this one's.
const last = new Promise((resolve) => {
  answered = resolve;
});
session.sendMessage('Thank you.');
await last;
session.close();
out({ kind: 'closed' });
process.exit(0);
