// Drives `sala serve` with the official OpenAI Node client: chat and completions, streamed and
// not, model listing and error mapping. Usage: node openai_client.mjs BASE_URL API_KEY MODEL
// Exits 1 with the reason on any mismatch.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: apiKey || 'unused', maxRetries: 0, timeout: 60_000 });
const messages = [{ role: 'user', content: 'Say something about the sea.' }];

// Chat, not streamed.
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices.length, 1);
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(typeof chat.choices[0].message.content, 'string');
assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);

// Chat, streamed: same greedy text, role first, usage last.
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = '', finish = null, usage = null, first = true;
for await (const chunk of stream) {
  assert.equal(chunk.object, 'chat.completion.chunk');
  if (first) {
    assert.equal(chunk.choices[0].delta.role, 'assistant');
    first = false;
  }
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.equal(text, chat.choices[0].message.content);
assert.equal(finish, chat.choices[0].finish_reason);
assert.equal(usage.completion_tokens, chat.usage.completion_tokens);

// Completions, both ways.
const comp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0 });
assert.equal(comp.object, 'text_completion');
let ctext = '';
for await (const chunk of await client.completions.create({
  model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, stream: true,
})) {
  for (const c of chunk.choices) ctext += c.text;
}
assert.equal(ctext, comp.choices[0].text);

// Logprobs come back in the chat shape.
const lp = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
assert.equal(lp.choices[0].logprobs.content.length, lp.usage.completion_tokens - (lp.choices[0].finish_reason === 'stop' ? 1 : 0));
for (const t of lp.choices[0].logprobs.content) assert.equal(t.top_logprobs.length, 2);

// Models.
const ids = [];
for await (const m of client.models.list()) ids.push(m.id);
assert.ok(ids.includes(model), `models ${ids} lack ${model}`);

// Errors map to the client's error classes.
await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }), OpenAI.NotFoundError);
await assert.rejects(client.chat.completions.create({ model, messages, n: 2 }), OpenAI.BadRequestError);

console.log(`openai client: chat + completions, streamed and not, logprobs, models, errors: ok (${ids.length} models)`);
