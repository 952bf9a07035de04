// The npm openai client and Anthropic's SDK against kvgate, as a user's app
// would call them.
// KVGATE_BASE_URL is the gateway's /v1 URL; KVGATE_MODEL the model it
// serves (llama-3-8b unless set). Prints one JSON line: each call's result
// or error, and "ok"; exits 1 if any call failed its check.
//
// Run by gateway/npmclient_test.go; install with
//   npm ci --prefix gateway/testdata/npmclient
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const baseURL = process.env.KVGATE_BASE_URL;
const model = process.env.KVGATE_MODEL || "llama-3-8b";
if (!baseURL) {
  console.error("KVGATE_BASE_URL is not set");
  process.exit(2);
}

// The gateway's root, where vLLM's /tokenize and /detokenize are and
// below which Anthropic's SDK adds /v1/messages.
const rootURL = baseURL.replace(/\/v1\/?$/, "");

// Each request's path and JSON body, to see what the client asked for
// beneath what it hands back.
const sent = [];
async function recordingFetch(url, init) {
  let body = null;
  try {
    body = typeof init?.body === "string" ? JSON.parse(init.body) : null;
  } catch {}
  sent.push({ path: new URL(url).pathname, body });
  return fetch(url, init);
}

// No retries: a failure is the first answer's, not hidden by a second try.
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30_000, fetch: recordingFetch });
const results = {};
let failed = false;

async function check(name, fn) {
  try {
    results[name] = await fn();
  } catch (err) {
    failed = true;
    results[name] = { error: String(err && err.stack ? err.stack : err) };
  }
}

function must(cond, what) {
  if (!cond) throw new Error(what);
}

await check("chat", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Say hello in five words." }],
    max_tokens: 5,
  });
  const c = r.choices[0];
  must(r.choices.length === 1 && c.message.content, `no content: ${JSON.stringify(r)}`);
  must(r.usage && r.usage.completion_tokens === 5, `usage: ${JSON.stringify(r.usage)}`);
  return { content: c.message.content, finish_reason: c.finish_reason, completion_tokens: r.usage.completion_tokens };
});

await check("chat_stream", async () => {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Count to ten." }],
    max_tokens: 10,
    stream: true,
  });
  let content = "";
  let chunks = 0;
  let finish_reason = null;
  for await (const chunk of stream) {
    chunks++;
    for (const ch of chunk.choices) {
      content += ch.delta?.content ?? "";
      if (ch.finish_reason) finish_reason = ch.finish_reason;
    }
  }
  must(content, "no content streamed");
  must(finish_reason, "no finish_reason in the stream");
  return { content, chunks, finish_reason };
});

await check("completion", async () => {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 7 });
  must(r.choices.length === 1 && r.choices[0].text, `no text: ${JSON.stringify(r)}`);
  must(r.usage && r.usage.completion_tokens === 7, `usage: ${JSON.stringify(r.usage)}`);
  return { text: r.choices[0].text, completion_tokens: r.usage.completion_tokens };
});

// The client asks for base64 unless told otherwise and decodes it itself:
// what comes back must be the float32s that encoding_format "float" gives.
await check("embedding", async () => {
  const input = ["the quick brown fox", "jumps"];
  const r = await client.embeddings.create({ model, input });
  const asked = sent.findLast((s) => s.path.endsWith("/embeddings"))?.body;
  must(asked && asked.encoding_format === "base64", `the client asked for ${JSON.stringify(asked)}`);
  must(r.data.length === 2, `data: ${r.data.length} items`);
  for (const d of r.data) {
    must(Array.isArray(d.embedding) && d.embedding.length > 0, `embedding ${d.index}: ${typeof d.embedding}`);
    must(d.embedding.every(Number.isFinite), `embedding ${d.index}: not all finite numbers`);
  }
  must(r.usage && r.usage.prompt_tokens > 0, `usage: ${JSON.stringify(r.usage)}`);
  const f = await client.embeddings.create({ model, input, encoding_format: "float" });
  const same = f.data.every((d, i) => d.embedding.length === r.data[i].embedding.length &&
    d.embedding.every((x, j) => Math.fround(x) === r.data[i].embedding[j]));
  must(same, "the base64 embeddings differ from the float ones");
  return {
    count: r.data.length,
    dims: r.data[0].embedding.length,
    prompt_tokens: r.usage.prompt_tokens,
    encoding_format: asked.encoding_format,
    matches_float: same,
  };
});

// The Responses API, which the AI SDK's openai('model') and the client's
// responses.create use: plain, and streamed as its typed events.
await check("response", async () => {
  const r = await client.responses.create({ model, input: "Say hello in five words.", max_output_tokens: 6 });
  must(r.output_text, `no output_text: ${JSON.stringify(r)}`);
  must(r.usage && r.usage.output_tokens === 6 && r.usage.input_tokens > 0, `usage: ${JSON.stringify(r.usage)}`);
  return { text: r.output_text, output_tokens: r.usage.output_tokens };
});

await check("response_stream", async () => {
  const stream = await client.responses.create({ model, input: "Count to ten.", max_output_tokens: 9, stream: true });
  let text = "";
  let deltas = 0;
  let completed = null;
  for await (const ev of stream) {
    if (ev.type === "response.output_text.delta") {
      text += ev.delta;
      deltas++;
    }
    // Cut by max_output_tokens, a response ends incomplete.
    if (ev.type === "response.completed" || ev.type === "response.incomplete") completed = ev.response;
  }
  must(text, "no text streamed");
  must(completed && completed.usage && completed.usage.output_tokens === 9, `completed: ${JSON.stringify(completed)}`);
  return { text, deltas, output_tokens: completed.usage.output_tokens, status: completed.status };
});

await check("models", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  must(ids.includes(model), `models: ${JSON.stringify(ids)}`);
  return { ids };
});

await check("unknown_model", async () => {
  try {
    await client.chat.completions.create({
      model: "no-such-model",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 3,
    });
  } catch (err) {
    must(err instanceof OpenAI.NotFoundError, `raised ${err && err.constructor && err.constructor.name}: ${err}`);
    must(err.status === 404, `status ${err.status}`);
    return { error: err.constructor.name, status: err.status, code: err.code, param: err.param };
  }
  throw new Error("an unknown model was answered");
});

// vLLM's /tokenize and /detokenize, which the client has no method for:
// through the fetch it is given, as its own requests go.
await check("detokenize", async () => {
  const text = "Hello, world! 12345 ünïcödé";
  const call = async (path, body) => {
    const r = await recordingFetch(rootURL + path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const b = await r.json();
    must(r.ok, `${path}: ${r.status} ${JSON.stringify(b)}`);
    return b;
  };
  const t = await call("/tokenize", { model, prompt: text, add_special_tokens: false });
  must(Array.isArray(t.tokens) && t.tokens.length === t.count && t.count > 0, `/tokenize: ${JSON.stringify(t)}`);
  const d = await call("/detokenize", { model, tokens: t.tokens });
  must(d.prompt === text, `/detokenize gave ${JSON.stringify(d.prompt)} for ${JSON.stringify(text)}`);
  return { text: d.prompt, tokens: t.count };
});

// Anthropic's SDK counts a message's tokens on /v1/messages/count_tokens;
// an unknown model is raised as its NotFoundError, which it can only do
// from an error in Anthropic's shape.
const anthropic = new Anthropic({ baseURL: rootURL, apiKey: "unused", maxRetries: 0, timeout: 30_000 });
await check("count_tokens", async () => {
  const count = (content) => anthropic.messages.countTokens({ model, messages: [{ role: "user", content }] });
  const short = await count("Hi");
  const long = await count("Hi, and a good deal more than that, said at length.");
  must(short.input_tokens > 0 && long.input_tokens > short.input_tokens,
    `input_tokens ${JSON.stringify(short)} then ${JSON.stringify(long)}`);
  let unknown = null;
  try {
    await anthropic.messages.countTokens({ model: "no-such-model", messages: [{ role: "user", content: "Hi" }] });
  } catch (err) {
    must(err instanceof Anthropic.NotFoundError, `raised ${err && err.constructor && err.constructor.name}: ${err}`);
    unknown = { error: err.constructor.name, status: err.status, type: err.error?.error?.type };
  }
  must(unknown, "an unknown model was counted");
  return { short: short.input_tokens, long: long.input_tokens, unknown_model: unknown };
});

results.ok = !failed;
console.log(JSON.stringify(results));
process.exit(failed ? 1 : 0);
