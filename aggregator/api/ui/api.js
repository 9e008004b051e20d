// The aggregator's JSON API as the page uses it: the bearer token (session storage only,
// never in a URL), JSON GETs, and the alert SSE stream read with fetch, because
// EventSource cannot send an Authorization header.

const TOKEN_KEY = "nicfleet.token";

export class AuthRequired extends Error {
  constructor(message) {
    super(message || "authentication required");
    this.name = "AuthRequired";
  }
}

export class ApiError extends Error {
  constructor(status, message, suggestions) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.suggestions = Array.isArray(suggestions) ? suggestions.map(String) : [];
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const token = getToken();
  return token ? { ...extra, Authorization: `Bearer ${token}` } : { ...extra };
}

/** GET `path` with `params`; AuthRequired on 401, ApiError with the API's message else. */
export async function getJSON(path, params = {}, signal = undefined) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined) url.searchParams.set(key, String(value));
  }
  const response = await fetch(url, {
    headers: headers({ Accept: "application/json" }),
    cache: "no-store",
    signal,
  });
  if (response.status === 401) throw new AuthRequired(await errorMessage(response));
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    const error = body && typeof body === "object" ? body.error ?? {} : {};
    const message = typeof error.message === "string" ? error.message : response.statusText;
    throw new ApiError(response.status, message, error.suggestions);
  }
  return response.json();
}

const PAGE_SIZE = 5000; // the API's largest page: the fewest round trips
const MAX_PAGES = 10000;

/** GET a paged list to its end, following `continue`: the last page with every item. */
export async function getAllJSON(path, params = {}, signal = undefined) {
  const items = [];
  let token = null;
  for (let page = 0; page < MAX_PAGES; page += 1) {
    const body = await getJSON(path, { ...params, limit: PAGE_SIZE, continue: token }, signal);
    items.push(...(body.items ?? []));
    if (typeof body.continue !== "string") {
      delete body.continue;
      return { ...body, items, count: items.length };
    }
    token = body.continue;
  }
  throw new ApiError(0, `${path} kept answering continue for ${MAX_PAGES} pages`);
}

async function errorMessage(response) {
  const body = await response.json().catch(() => null);
  const message = body && body.error && body.error.message;
  return typeof message === "string" ? message : `HTTP ${response.status}`;
}

/**
 * Follow /api/v1/alerts/stream until `signal` aborts: `onEvent(kind, data)` per event
 * ("resync" or "alert", data parsed), `onState(state)` with "live", "reconnecting" or
 * "auth" (then it stops: the caller asks for a token and starts a new stream). Resumes
 * with Last-Event-ID after the server's `retry` delay when the connection drops.
 */
export async function followAlerts({ onEvent, onState, signal }) {
  let lastId = null;
  let retryMs = 2000;
  while (!signal.aborted) {
    try {
      const extra = { Accept: "text/event-stream" };
      if (lastId !== null) extra["Last-Event-ID"] = lastId;
      const response = await fetch("/api/v1/alerts/stream", {
        headers: headers(extra),
        cache: "no-store",
        signal,
      });
      if (response.status === 401) {
        onState("auth");
        return;
      }
      if (!response.ok || !response.body) throw new ApiError(response.status, "stream refused");
      onState("live");
      await readEvents(response.body, (event) => {
        if (event.retry !== null) retryMs = event.retry;
        if (event.id !== null) lastId = event.id;
        if (event.data !== null) onEvent(event.event || "message", JSON.parse(event.data));
      });
    } catch (error) {
      if (signal.aborted) return;
      if (!(error instanceof TypeError || error instanceof ApiError || error instanceof SyntaxError)) {
        throw error;
      }
    }
    if (signal.aborted) return;
    onState("reconnecting");
    await pause(retryMs, signal);
  }
}

/** Parse a text/event-stream body (the WHATWG rules: fields, comments, blank line ends). */
async function readEvents(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = blankEvent();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (event.data !== null || event.retry !== null) dispatch(event);
        event = blankEvent();
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let data = colon < 0 ? "" : line.slice(colon + 1);
      if (data.startsWith(" ")) data = data.slice(1);
      if (field === "data") event.data = event.data === null ? data : `${event.data}\n${data}`;
      else if (field === "event") event.event = data;
      else if (field === "id") event.id = data;
      else if (field === "retry" && /^\d+$/.test(data)) event.retry = Number(data);
    }
  }
}

function blankEvent() {
  return { event: "", data: null, id: null, retry: null };
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}
