// The console's only way to the server: every call carries the token as a bearer
// header; errors become ApiError with the API's own message. Server-sent events are
// read through fetch streaming (EventSource cannot send headers).

const TOKEN_KEY = "keel.token";

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra) {
  return Object.assign({ Authorization: `Bearer ${token()}`, Accept: "application/json" }, extra || {});
}

async function errorOf(response) {
  let kind = "http_" + response.status;
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) {
      kind = body.error.kind || kind;
      message = body.error.message || message;
    }
  } catch (_) {
    // Not JSON: keep the status line.
  }
  return new ApiError(response.status, kind, message);
}

/** GET (or `method`) a JSON API path; `body` is sent as JSON. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "network", `the server did not answer (${err.message}); is keel serve running?`);
  }
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/**
 * Follows a server-sent event stream: calls `onEvent({event, data, id})` for each event
 * (data parsed as JSON when it is JSON) until `signal` aborts or the stream ends, then
 * resolves. `onOpen` is called once the server accepted the stream.
 */
export async function follow(path, { signal, onEvent, onOpen }) {
  const response = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) throw await errorOf(response);
  if (onOpen) onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const event = { event: "message", data: "", id: null };
      const data = [];
      for (const line of frame.split(/\r?\n/)) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event.event = text;
        else if (field === "data") data.push(text);
        else if (field === "id") event.id = text;
      }
      if (!data.length) continue;
      const raw = data.join("\n");
      try {
        event.data = JSON.parse(raw);
      } catch (_) {
        event.data = raw;
      }
      onEvent(event);
    }
  }
}

/** Keeps `follow` going across disconnects (with a pause), until `signal` aborts. */
export async function followForever(path, { signal, onEvent, onOpen, onDown }) {
  while (!signal.aborted) {
    try {
      await follow(path, { signal, onEvent, onOpen });
    } catch (err) {
      if (signal.aborted) return;
      if (onDown) onDown(err);
      if (err instanceof ApiError && (err.status === 401 || err.status === 404)) return;
    }
    if (signal.aborted) return;
    if (onDown) onDown(null);
    await new Promise((resolve) => setTimeout(resolve, 1500));
  }
}
