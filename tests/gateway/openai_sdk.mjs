// openai_sdk.mjs - the official OpenAI Node SDK against a running
// baton-http (issue 39), driven by test_openai_sdk.sh, which installs the
// `openai` package and starts the cluster.
//
// Environment: BATON_URL (http://127.0.0.1:PORT/v1), BATON_KEY (a valid
// API key), BATON_MODEL (the served model id), OPENAI_SDK_DIR (the npm
// prefix the package was installed into).
//
// Checks: models.list; a completion and a chat completion (text, usage
// counts); streaming completions and chat whose chunks concatenate to the
// non-stream text (greedy, temperature 0), with the usage chunk of
// stream_options.include_usage; logprobs (issue 39): the legacy format
// (tokens concatenate to the text, greedy token is the top-1, text_offset
// counts characters), echo (prompt first, its first logprob null, the
// completion's logprobs unchanged), streamed logprobs equal to the
// non-stream ones, chat logprobs.content with bytes and top_logprobs,
// logprobs 21 refused; errors mapped to the SDK's classes: 400
// BadRequestError naming the parameter, 404 NotFoundError for an unknown
// model, 401 AuthenticationError for a wrong key; a prompt list (choices
// in order, each equal to its prompt alone, streamed by index) and chat n.  Exits 0 on success,
// 1 with a message on the first failure; bounded by a 120 s timer.
import { createRequire } from "node:module";
import path from "node:path";

const timer = setTimeout(() => {
  console.error("FAIL: openai_sdk.mjs timed out after 120 s");
  process.exit(1);
}, 120000);

const require = createRequire(path.join(process.env.OPENAI_SDK_DIR, "x.js"));
const OpenAI = require("openai");
const baseURL = process.env.BATON_URL;
const model = process.env.BATON_MODEL;
const client = new OpenAI({
  baseURL,
  apiKey: process.env.BATON_KEY,
  maxRetries: 0,
  timeout: 30000,
});

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function expectError(cls, status, fn, what) {
  try {
    await fn();
  } catch (e) {
    check(e instanceof cls, `${what}: ${e.constructor.name}, expected ${cls.name} (${e.message})`);
    check(e.status === status, `${what}: status ${e.status}, expected ${status}`);
    return e;
  }
  throw new Error(`${what}: no error`);
}

async function main() {
  // models
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  check(models.includes(model), `models.list: ${JSON.stringify(models)}`);

  // completion
  const params = { model, prompt: "The river", max_tokens: 12, temperature: 0 };
  const c = await client.completions.create(params);
  const text = c.choices[0].text;
  check(typeof text === "string" && text.length > 0, `completion text: ${JSON.stringify(c)}`);
  check(c.usage.prompt_tokens > 0 && c.usage.completion_tokens > 0 &&
        c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens,
        `completion usage: ${JSON.stringify(c.usage)}`);
  check(c.model === model && c.object === "text_completion", `completion: ${JSON.stringify(c)}`);

  // chat
  const messages = [{ role: "system", content: "Be brief." },
                    { role: "user", content: "Tell me a story" }];
  const chatParams = { model, messages, max_tokens: 12, temperature: 0 };
  const ch = await client.chat.completions.create(chatParams);
  const msg = ch.choices[0].message;
  check(msg.role === "assistant" && typeof msg.content === "string" && msg.content.length > 0,
        `chat message: ${JSON.stringify(ch)}`);
  check(ch.usage.prompt_tokens > 0 && ch.usage.completion_tokens > 0, `chat usage: ${JSON.stringify(ch.usage)}`);

  // streaming completion: the chunks are the non-stream text
  let streamed = "", nChunks = 0, finish = null;
  const s = await client.completions.create({ ...params, stream: true });
  for await (const chunk of s) {
    nChunks++;
    if (chunk.choices.length > 0) {
      streamed += chunk.choices[0].text;
      finish = chunk.choices[0].finish_reason ?? finish;
    }
  }
  check(streamed === text, `stream text ${JSON.stringify(streamed)} != ${JSON.stringify(text)}`);
  check(nChunks >= 2 && finish !== null, `stream: ${nChunks} chunks, finish ${finish}`);

  // streaming chat with the usage chunk
  let chatStreamed = "", usage = null, role = null;
  const cs = await client.chat.completions.create({
    ...chatParams, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of cs) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length > 0) {
      const d = chunk.choices[0].delta;
      if (d.role) role = d.role;
      if (d.content) chatStreamed += d.content;
    }
  }
  check(chatStreamed === msg.content,
        `chat stream ${JSON.stringify(chatStreamed)} != ${JSON.stringify(msg.content)}`);
  check(role === "assistant", `chat stream role ${role}`);
  check(usage !== null && usage.completion_tokens === ch.usage.completion_tokens &&
        usage.prompt_tokens === ch.usage.prompt_tokens,
        `chat stream usage ${JSON.stringify(usage)} vs ${JSON.stringify(ch.usage)}`);

  // logprobs (issue 39): the legacy completions format, greedy
  const lpc = await client.completions.create({ ...params, logprobs: 3 });
  const lp = lpc.choices[0].logprobs;
  check(lpc.choices[0].text === text, `logprobs changed the text: ${JSON.stringify(lpc)}`);
  check(lp && lp.tokens.length === lpc.usage.completion_tokens &&
        lp.token_logprobs.length === lp.tokens.length &&
        lp.top_logprobs.length === lp.tokens.length &&
        lp.text_offset.length === lp.tokens.length, `logprobs shape: ${JSON.stringify(lp)}`);
  check(lp.tokens.join("") === text, `tokens ${JSON.stringify(lp.tokens)} != text`);
  let off = 0;
  lp.tokens.forEach((t, i) => {
    const top = lp.top_logprobs[i];
    const best = Math.max(...Object.values(top));
    check(lp.token_logprobs[i] <= 0, `logprob ${i} > 0`);
    check(Object.keys(top).length >= 3 && top[t] === lp.token_logprobs[i] && best === top[t],
          `greedy token ${JSON.stringify(t)} is not the top-1: ${JSON.stringify(top)}`);
    check(lp.text_offset[i] === off, `text_offset ${i}: ${lp.text_offset[i]} != ${off}`);
    off += [...t].length;
  });

  // echo: the prompt's tokens first (the first without a logprob)
  const ec = await client.completions.create({ ...params, logprobs: 1, echo: true });
  const el = ec.choices[0].logprobs;
  const nPrompt = el.tokens.length - lp.tokens.length;
  check(ec.choices[0].text === params.prompt + text, `echo text ${JSON.stringify(ec.choices[0].text)}`);
  check(nPrompt === ec.usage.prompt_tokens && el.token_logprobs[0] === null &&
        el.top_logprobs[0] === null, `echo prompt logprobs: ${JSON.stringify(el)}`);
  check(el.token_logprobs.slice(1).every((v) => typeof v === "number" && v <= 0),
        `echo logprobs: ${JSON.stringify(el.token_logprobs)}`);
  check(el.token_logprobs.slice(nPrompt).every((v, i) => v === lp.token_logprobs[i]),
        `echo's completion logprobs differ from the plain request's`);
  check(el.text_offset[nPrompt] === params.prompt.length, `echo text_offset ${el.text_offset}`);

  // streamed logprobs are the non-stream ones, chunk by chunk
  const st = [], stl = [];
  for await (const chunk of await client.completions.create({ ...params, logprobs: 3, stream: true })) {
    const l = chunk.choices.length > 0 ? chunk.choices[0].logprobs : null;
    if (l) { st.push(...l.tokens); stl.push(...l.token_logprobs); }
  }
  check(JSON.stringify(st) === JSON.stringify(lp.tokens) &&
        JSON.stringify(stl) === JSON.stringify(lp.token_logprobs),
        `stream logprobs ${JSON.stringify(stl)} != ${JSON.stringify(lp.token_logprobs)}`);

  // chat: logprobs.content with bytes and top_logprobs
  const cl = await client.chat.completions.create({ ...chatParams, logprobs: true, top_logprobs: 2 });
  const content = cl.choices[0].logprobs.content;
  check(content.length === cl.usage.completion_tokens &&
        content.map((e) => e.token).join("") === cl.choices[0].message.content,
        `chat logprobs: ${JSON.stringify(cl.choices[0])}`);
  for (const e of content)
    check(e.logprob <= 0 && Array.isArray(e.bytes) && e.top_logprobs.length === 2 &&
          e.top_logprobs[0].token === e.token && e.top_logprobs[0].logprob === e.logprob &&
          e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob,
          `chat logprob entry ${JSON.stringify(e)}`);
  const lpBad = await expectError(OpenAI.BadRequestError, 400,
    () => client.completions.create({ ...params, logprobs: 21 }), "logprobs 21");
  check(lpBad.param === "logprobs", `400 param ${lpBad.param}`);

  // structured output (issue 39): response_format json_schema, the
  // reply parsed by the client as JSON and checked against the schema
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 12 },
      mood: { enum: ["calm", "wild", "sad"] },
      count: { type: "integer", minimum: 0, maximum: 99 },
    },
    required: ["name", "mood", "count"],
    additionalProperties: false,
  };
  const so = await client.chat.completions.create({
    ...chatParams, max_tokens: 200, temperature: 0,
    response_format: { type: "json_schema", json_schema: { name: "dream", schema, strict: true } },
  });
  const obj = JSON.parse(so.choices[0].message.content);
  check(so.choices[0].finish_reason === "stop" && typeof obj.name === "string" &&
        obj.name.length <= 12 && ["calm", "wild", "sad"].includes(obj.mood) &&
        Number.isInteger(obj.count) && obj.count >= 0 && obj.count <= 99 &&
        Object.keys(obj).length === 3, `json_schema reply ${so.choices[0].message.content}`);
  const bogus = await expectError(OpenAI.BadRequestError, 400,
    () => client.chat.completions.create({ ...chatParams, response_format: {
      type: "json_schema", json_schema: { name: "x", schema: { type: "object", patternProperties: {} } } } }),
    "unsupported schema keyword");
  check(/patternProperties/.test(bogus.message), `400 message ${bogus.message}`);

  // a prompt list (one choice per prompt, in order) and n, as the SDK
  // sends them; each list choice equals its prompt alone (greedy)
  const prompts = ["The river", "A quiet machine", "Stars fall"];
  const lc = await client.completions.create({ ...params, prompt: prompts });
  check(lc.choices.length === 3 && lc.choices.every((x, i) => x.index === i),
        `list choices ${JSON.stringify(lc.choices)}`);
  let alonePrompt = 0, aloneCompletion = 0;
  for (let i = 0; i < 3; i++) {
    const one = await client.completions.create({ ...params, prompt: prompts[i] });
    check(lc.choices[i].text === one.choices[0].text,
          `list choice ${i} ${JSON.stringify(lc.choices[i].text)} != ${JSON.stringify(one.choices[0].text)}`);
    alonePrompt += one.usage.prompt_tokens;
    aloneCompletion += one.usage.completion_tokens;
  }
  check(lc.usage.prompt_tokens === alonePrompt && lc.usage.completion_tokens === aloneCompletion,
        `list usage ${JSON.stringify(lc.usage)}`);
  const seen = new Map();
  for await (const chunk of await client.completions.create({ ...params, prompt: prompts, stream: true })) {
    for (const x of chunk.choices) seen.set(x.index, (seen.get(x.index) ?? "") + x.text);
  }
  check(seen.size === 3 && [0, 1, 2].every((i) => seen.get(i) === lc.choices[i].text),
        `list stream ${JSON.stringify([...seen])}`);
  const nc = await client.chat.completions.create({ ...chatParams, n: 2 });
  check(nc.choices.length === 2 && nc.choices[1].index === 1 &&
        nc.choices[1].message.content === msg.content, `chat n=2 ${JSON.stringify(nc.choices)}`);
  const ebad = await expectError(OpenAI.BadRequestError, 400,
    () => client.completions.create({ ...params, prompt: ["a", 5] }), "list with a number");
  check(/prompt\[1\]/.test(ebad.message), `400 message ${ebad.message}`);

  // errors in the SDK's classes
  const bad = await expectError(OpenAI.BadRequestError, 400,
    () => client.completions.create({ ...params, temperature: -1 }), "temperature -1");
  check(bad.param === "temperature", `400 param ${bad.param}`);
  await expectError(OpenAI.BadRequestError, 400,
    () => client.chat.completions.create({ model, messages: [] }), "no messages");
  await expectError(OpenAI.NotFoundError, 404,
    () => client.completions.create({ ...params, model: "gpt-4" }), "unknown model");
  const wrong = new OpenAI({ baseURL, apiKey: "sk-wrong-key-0123456789", maxRetries: 0 });
  const auth = await expectError(OpenAI.AuthenticationError, 401,
    () => wrong.completions.create(params), "wrong key");
  check(auth.code === "invalid_api_key", `401 code ${auth.code}`);

  console.log(`openai sdk: models ${JSON.stringify(models)}; completion ` +
              `${JSON.stringify(text)} (${c.usage.completion_tokens} tokens) = ` +
              `${nChunks} stream chunks; chat ${JSON.stringify(msg.content)} = stream; ` +
              `logprobs, echo, stream and chat logprobs consistent; ` +
              `a list of 3 prompts and chat n=2 as choices 0..; ` +
              `json_schema reply ${JSON.stringify(obj)} parsed; ` +
              `400/404/401 mapped to the SDK's error classes`);
}

main().then(() => {
  clearTimeout(timer);
  process.exit(0);
}, (e) => {
  console.error(`FAIL: ${e.message}`);
  process.exit(1);
});
