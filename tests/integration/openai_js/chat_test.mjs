// The official `openai` npm package against a real `recall serve` (run.sh starts it and
// passes the API's base URL): the models list; a streamed multi-turn chat that resends the
// whole list each turn, naming its session with the X-Session-Id header the first reply
// carried, then without it (matched by its list); usage and finish reasons; the cache reused
// on later turns (cached_tokens > 0); a request sent again with its Idempotency-Key answered
// from the store; a completion; logprobs with alternatives (a streamed chat and a
// completion); an error the SDK raises with its status and param; a final 409 (the turn
// limit) the SDK does not retry. Prints
// PASS/FAIL per check; exits 1 if any failed.
import OpenAI from 'openai';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'no-key-needed', maxRetries: 0, timeout: 120000 });
let failures = 0;
function check(ok, what, detail = '') {
  console.log(`${ok ? 'PASS' : 'FAIL'} ${what}${ok || !detail ? '' : `: ${detail}`}`);
  if (!ok) failures++;
}

async function streamTurn(model, messages, headers) {
  const { data: stream, response } = await client.chat.completions
    .create(
      { model, messages, stream: true, stream_options: { include_usage: true }, max_tokens: 24,
        temperature: 0 },
      { headers },
    )
    .withResponse();
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.choices.length > 0) {
      text += chunk.choices[0].delta?.content ?? '';
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, finish, usage, chunks, session: response.headers.get('x-session-id') };
}

try {
  const models = await client.models.list();
  const model = models.data[0]?.id;
  check(models.data.length === 1 && typeof model === 'string', 'models.list: one served model',
        JSON.stringify(models.data));

  const messages = [
    { role: 'system', content: 'Tell a story.' },
    { role: 'user', content: 'Once upon a time' },
  ];
  const one = await streamTurn(model, messages, {});
  check(one.text.length > 0, 'turn 1: the streamed reply has text', JSON.stringify(one));
  check(['stop', 'length'].includes(one.finish), 'turn 1: finish_reason', one.finish);
  check(one.usage?.completion_tokens > 0 && one.usage?.prompt_tokens > 0,
        'turn 1: usage in the last chunk', JSON.stringify(one.usage));
  check(/^s-/.test(one.session ?? ''), 'turn 1: X-Session-Id names the new session', one.session);

  messages.push({ role: 'assistant', content: one.text });
  messages.push({ role: 'user', content: 'What happened next?' });
  const two = await streamTurn(model, messages, { 'X-Session-Id': one.session });
  check(two.session === one.session, 'turn 2: the same session', `${two.session} != ${one.session}`);
  check(two.text.length > 0, 'turn 2: the reply has text');
  check(two.usage?.prompt_tokens_details?.cached_tokens > 0,
        'turn 2: the whole list resent, the session\'s cache reused (cached_tokens > 0)',
        JSON.stringify(two.usage));

  // A client that never names the session: matched by its list.
  messages.push({ role: 'assistant', content: two.text });
  messages.push({ role: 'user', content: 'And then?' });
  const { data: three, response } = await client.chat.completions
    .create({ model, messages, max_tokens: 8, temperature: 0 })
    .withResponse();
  check(response.headers.get('x-session-id') === one.session,
        'turn 3 (no session named, not streamed): matched to the same session',
        response.headers.get('x-session-id'));
  check(three.choices[0].message.content.length > 0 && three.choices[0].finish_reason !== null,
        'turn 3: a chat.completion with text and a finish_reason', JSON.stringify(three));
  check(three.usage?.prompt_tokens_details?.cached_tokens > 0, 'turn 3: cached_tokens > 0',
        JSON.stringify(three.usage));

  // The same request twice with one Idempotency-Key: the second is the stored turn, not a
  // second run (the session keeps one turn of it).
  const keyed = [{ role: 'user', content: 'Once upon a time' }];
  const options = { headers: { 'Idempotency-Key': 'js-turn-1' } };
  const first = await client.chat.completions
    .create({ model, messages: keyed, max_tokens: 8, temperature: 0.9 }, options)
    .withResponse();
  const again = await client.chat.completions
    .create({ model, messages: keyed, max_tokens: 8, temperature: 0.9 }, options)
    .withResponse();
  check(again.response.headers.get('idempotent-replayed') === 'true' &&
        again.data.choices[0].message.content === first.data.choices[0].message.content &&
        again.response.headers.get('x-session-id') === first.response.headers.get('x-session-id'),
        'Idempotency-Key: the same request again gets the stored reply of the same session',
        `${again.response.headers.get('idempotent-replayed')} ${JSON.stringify(again.data)}`);

  const completion = await client.completions.create({ model, prompt: 'Once upon a time',
                                                       max_tokens: 8, temperature: 0 });
  check(completion.choices[0].text.length > 0 && completion.usage.completion_tokens === 8,
        'completions.create: text and usage', JSON.stringify(completion));

  // Logprobs, streamed: one entry per token over the chunks, each with its alternatives; the
  // greedy token is the most likely one; the entries' bytes spell the reply.
  const lpStream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Once upon a time' }], stream: true,
    stream_options: { include_usage: true }, max_tokens: 12, temperature: 0, logprobs: true,
    top_logprobs: 3 });
  let lpText = '';
  let lpUsage = null;
  const entries = [];
  for await (const chunk of lpStream) {
    if (chunk.usage) lpUsage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    lpText += chunk.choices[0].delta?.content ?? '';
    entries.push(...(chunk.choices[0].logprobs?.content ?? []));
  }
  const spelled = Buffer.from(entries.flatMap((e) => e.bytes)).toString('utf8');
  check(entries.length === lpUsage?.completion_tokens && entries.length > 0 &&
        entries.every((e) => e.top_logprobs.length === 3 && e.logprob <= 0 &&
                             e.top_logprobs[0].token === e.token &&
                             e.top_logprobs[0].logprob === e.logprob) &&
        spelled === lpText,
        'chat logprobs (streamed): one per token, 3 alternatives, the greedy one first, bytes ' +
        'spell the reply', JSON.stringify({ lpText, spelled, usage: lpUsage, first: entries[0] }));

  const lpCompletion = await client.completions.create({ model, prompt: 'Once upon a time',
                                                         max_tokens: 8, temperature: 0,
                                                         logprobs: 2 });
  const lp = lpCompletion.choices[0].logprobs;
  check(lp?.tokens.length === 8 && lp.token_logprobs.length === 8 &&
        lp.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2) &&
        lp.tokens.join('') === lpCompletion.choices[0].text && lp.text_offset[0] === 0,
        'completions logprobs: tokens, token_logprobs, top_logprobs, text_offset',
        JSON.stringify(lpCompletion.choices[0]));

  // A fourth turn passes the server's --max-turns 3 (run.sh): a 409 that says not to retry
  // (x-should-retry: false), so the SDK, which retries a 409 by default, asks once.
  let attempts = 0;
  const retrying = new OpenAI({ baseURL, apiKey: 'no-key-needed', maxRetries: 2, timeout: 120000,
                                fetch: (url, init) => { attempts++; return fetch(url, init); } });
  const four = [...messages, { role: 'assistant', content: three.choices[0].message.content },
                { role: 'user', content: 'The end?' }];
  try {
    await retrying.chat.completions.create({ model, messages: four, max_tokens: 4 },
                                           { headers: { 'X-Session-Id': one.session } });
    check(false, 'a turn past --max-turns is refused');
  } catch (e) {
    check(e instanceof OpenAI.ConflictError && /max_turns/.test(e.message) && attempts === 1 &&
          e.headers?.get('x-should-retry') === 'false',
          'a turn past --max-turns: ConflictError with x-should-retry false, asked once (maxRetries 2)',
          `${e.constructor.name} ${e.status} attempts=${attempts} ${e.message}`);
  }
  try {
    await client.chat.completions.create({ model, messages, temperature: 7 });
    check(false, 'a bad temperature is refused');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature' &&
          /\[0, 2\]/.test(e.message),
          'a bad temperature: BadRequestError, status 400, param temperature, the limit named',
          `${e.constructor.name} ${e.status} ${e.param} ${e.message}`);
  }
  try {
    await client.chat.completions.create({ model, messages }, { headers: { 'X-Session-Id': 's-none' } });
    check(false, 'an unknown session is refused');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.param === 'session_id',
          'an unknown session: NotFoundError, param session_id', `${e.constructor.name} ${e.message}`);
  }
} catch (e) {
  check(false, 'the chat ran', e?.stack ?? String(e));
}
console.log(failures === 0 ? 'openai js check: PASSED' : `openai js check: ${failures} FAILED`);
process.exit(failures === 0 ? 0 : 1);
