// The public HTTP API, as any client uses it: envelopes {code, msg, data}, SSE turns,
// and the tenant's API key (when auth is on) sent as "Authorization: Bearer".

const KEY_STORAGE = "contextmode.apiKey";

export class ApiError extends Error {
  constructor(status, code, msg) {
    super(msg || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }

  get unauthorized() {
    return this.status === 401;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function errorFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not an envelope (a proxy's error page): fall back to the status
  }
  return new ApiError(response.status, body?.code ?? response.status * 100, body?.msg ?? response.statusText);
}

/** GET `path` and return the envelope's data; throws ApiError on any error envelope. */
export async function getJSON(path, params = {}) {
  const query = new URLSearchParams(params).toString();
  const response = await fetch(query ? `${path}?${query}` : path, { headers: headers() });
  if (!response.ok) throw await errorFrom(response);
  const body = await response.json();
  if (body.code !== 0) throw new ApiError(response.status, body.code, body.msg);
  return body.data;
}

export const listSessions = () => getJSON("/v1/sessions", { limit: 100 });

export const getSession = (id, limit = 200) => getJSON(`/v1/sessions/${encodeURIComponent(id)}`, { limit });

/** The kept trace of exchange `turn` (1 = the first user message): what the model received. */
export const getTurnContext = (id, turn) => getJSON(`/v1/sessions/${encodeURIComponent(id)}/turns/${turn}/context`);

/** The bytes the session keeps by kind of record (as `contextmode stats` prints them). */
export const getStorage = (id) => getJSON(`/v1/sessions/${encodeURIComponent(id)}/storage`);

export function previewContext(id, message, mode) {
  const params = { message };
  if (mode) params.mode = mode;
  return getJSON(`/v1/sessions/${encodeURIComponent(id)}/context`, params);
}

/**
 * POST a message with stream=true and yield each SSE event's JSON payload
 * (context, delta…, done or error) as it arrives, read with fetch + ReadableStream.
 */
export async function* streamMessage(id, body, signal) {
  const response = await fetch(`/v1/sessions/${encodeURIComponent(id)}/messages`, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!response.ok) throw await errorFrom(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

/** Read image files as base64 data URLs (what the API takes in `images`). */
export function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}
