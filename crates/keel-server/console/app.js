// The Keel console: a hash-routed single page (#/runs, #/runs/<id>, #/inbox, #/costs,
// #/health) over the HTTP API, with one live stream of run changes shared by the pages.

import { ApiError, api, follow, followForever, query, setToken, token } from "./api.js";
import { chart } from "./charts.js";
import { schemaForm } from "./forms.js";
import { markdown } from "./markdown.js";
import {
  clear, debounce, fill, fmtAge, fmtCost, fmtDuration, fmtInt, fmtTime, h, json, s, stateBadge, toast,
} from "./render.js";

const PAGE_SIZE = 50;
const STATES = ["created", "queued", "running", "paused", "waiting", "recovering", "succeeded", "failed", "cancelled"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

const view = document.getElementById("view");
let page = null; // {leave(), onRunChange(run)?}
const changeListeners = new Set();
let changesAbort = null;

// ---------------------------------------------------------------- live run changes

function startChanges() {
  if (changesAbort) return;
  changesAbort = new AbortController();
  const dot = () => document.querySelectorAll(".live-dot");
  followForever("/v1/runs/changes", {
    signal: changesAbort.signal,
    onOpen: () => {
      dot().forEach((d) => d.classList.add("on"));
      document.body.dataset.live = "on";
      changeListeners.forEach((fn) => fn(null));
    },
    onDown: () => {
      dot().forEach((d) => d.classList.remove("on"));
      document.body.dataset.live = "off";
    },
    onEvent: (event) => {
      if (event.event === "run") changeListeners.forEach((fn) => fn(event.data));
      else if (event.event === "resync") changeListeners.forEach((fn) => fn(null));
    },
  });
}

function onChanges(fn) {
  changeListeners.add(fn);
  return () => changeListeners.delete(fn);
}

const refreshInboxCount = debounce(async () => {
  try {
    const inbox = await api("/v1/inbox");
    const badge = document.getElementById("inbox-count");
    badge.textContent = String(inbox.items.length);
    badge.hidden = inbox.items.length === 0;
  } catch (_) {
    // The pages show errors; the badge stays as it was.
  }
}, 400);

// ---------------------------------------------------------------- shell and routing

function showError(where, err) {
  fill(where, h("div", { class: "error", "data-role": "error" }, err.message || String(err)));
}

function route() {
  if (page && page.leave) page.leave();
  page = null;
  const hash = location.hash.replace(/^#/, "") || "/runs";
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search || "");
  const nav = document.getElementById("nav");
  if (!token()) {
    nav.hidden = true;
    document.getElementById("logout").hidden = true;
    page = loginPage();
    return;
  }
  nav.hidden = false;
  document.getElementById("logout").hidden = false;
  startChanges();
  refreshInboxCount();
  const parts = path.split("/").filter(Boolean);
  nav.querySelectorAll("a").forEach((a) => a.classList.toggle("active", a.dataset.page === parts[0]));
  clear(view);
  if (parts[0] === "runs" && parts[1]) page = runPage(decodeURIComponent(parts[1]));
  else if (parts[0] === "inbox") page = inboxPage();
  else if (parts[0] === "costs") page = costsPage(params);
  else if (parts[0] === "health") page = healthPage();
  else page = runsPage(params);
  view.focus({ preventScroll: true });
}

function logout() {
  setToken("");
  if (changesAbort) changesAbort.abort();
  changesAbort = null;
  location.hash = "#/login";
  route();
}

// ---------------------------------------------------------------- login

function loginPage() {
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "off", spellcheck: "false",
    placeholder: "operator or tenant token", required: true,
  });
  const error = h("div", { class: "error", role: "alert", "data-role": "login-error" });
  const button = h("button", { type: "submit" }, "Log in");
  const form = h(
    "form",
    { class: "panel login", id: "login" },
    h("h1", {}, "Keel console"),
    h("p", { class: "muted" }, "Paste the operator token (", h("code", {}, "<data dir>/api-token"),
      ") or a tenant's token (", h("code", {}, "keel tenant token NAME"), "). It is kept in this tab only."),
    h("label", { for: "token" }, "Token", input),
    h("div", { class: "row" }, button),
    error,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    button.disabled = true;
    setToken(input.value.trim());
    try {
      await api("/v1/runs?limit=1");
      location.hash = "#/runs";
      route();
    } catch (err) {
      setToken("");
      error.textContent = err.message;
    } finally {
      button.disabled = false;
    }
  });
  fill(view, form);
  input.focus();
  return {};
}

// ---------------------------------------------------------------- runs

function runsPage(params) {
  const state = {
    state: params.get("state") || "",
    tenant: params.get("tenant") || "",
    q: params.get("q") || "",
    sort: params.get("sort") || "newest",
    page: Math.max(0, Number(params.get("page") || 0) | 0),
  };
  let selected = 0;
  let rows = [];
  let abort = null;
  const stateSelect = h("select", { id: "filter-state", "aria-label": "state" },
    h("option", { value: "" }, "every state"), STATES.map((st) => h("option", { value: st }, st)));
  stateSelect.value = state.state;
  const tenantInput = h("input", { id: "filter-tenant", placeholder: "tenant", value: state.tenant, size: 12, "aria-label": "tenant" });
  const search = h("input", { id: "filter-text", type: "search", placeholder: "search id, tenant, command  ( / )", value: state.q, size: 34, "aria-label": "search" });
  const sortSelect = h("select", { id: "sort", "aria-label": "sort" },
    [["newest", "newest first"], ["oldest", "oldest first"], ["costliest", "costliest first"], ["cheapest", "cheapest first"]]
      .map(([v, t]) => h("option", { value: v }, t)));
  sortSelect.value = state.sort;
  const body = h("tbody", {});
  const error = h("div", { class: "error", "data-role": "error" });
  const pageInfo = h("span", { class: "muted small" });
  const prev = h("button", { type: "button", class: "ghost", onclick: () => go({ page: state.page - 1 }) }, "← Previous");
  const next = h("button", { type: "button", class: "ghost", onclick: () => go({ page: state.page + 1 }) }, "Next →");
  const sortButtons = [];
  const sortButton = (label, asc, desc) => {
    const button = h("button", { type: "button", class: "sort", onclick: () => go({ sort: state.sort === desc ? asc : desc, page: 0 }) });
    const show = () => { button.textContent = label + (state.sort === desc ? " ↓" : state.sort === asc ? " ↑" : ""); };
    show();
    sortButtons.push(show);
    return button;
  };
  const table = h("table", { id: "runs" },
    h("thead", {}, h("tr", {},
      h("th", {}, "Run"), h("th", {}, "Tenant"), h("th", {}, "State"), h("th", {}, "Command"),
      h("th", { class: "num" }, sortButton("Cost", "cheapest", "costliest")),
      h("th", { class: "num" }, "Tokens"),
      h("th", { class: "num" }, sortButton("Age", "oldest", "newest")))),
    body);

  function go(change) {
    Object.assign(state, change);
    sortSelect.value = state.sort;
    sortButtons.forEach((show) => show());
    const hash = "#/runs" + query({ state: state.state, tenant: state.tenant, q: state.q, sort: state.sort === "newest" ? "" : state.sort, page: state.page || "" });
    if (location.hash !== hash) history.replaceState(null, "", hash);
    load();
  }

  // Children under their parents (those on this page), depth first, in page order.
  function ordered(runs) {
    const byId = new Map(runs.map((r) => [r.run_id, r]));
    const children = new Map();
    const roots = [];
    for (const run of runs) {
      if (run.parent && byId.has(run.parent)) {
        if (!children.has(run.parent)) children.set(run.parent, []);
        children.get(run.parent).push(run);
      } else roots.push(run);
    }
    const out = [];
    const walk = (run, depth) => {
      out.push([run, depth]);
      for (const child of children.get(run.run_id) || []) walk(child, depth + 1);
    };
    roots.forEach((r) => walk(r, 0));
    return out;
  }

  function render(runs, more) {
    clear(body);
    rows = [];
    if (!runs.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No runs match.")));
    for (const [run, depth] of ordered(runs)) {
      const link = h("a", { href: `#/runs/${run.run_id}`, class: "mono" }, run.run_id);
      const first = h("td", {}, depth ? h("span", { class: "child-mark" }, "↳") : null, link,
        run.parent && !depth ? h("div", { class: "muted small" }, "child of ", h("a", { href: `#/runs/${run.parent}` }, run.parent)) : null);
      if (depth) first.style.paddingLeft = `${10 + depth * 22}px`;
      const tr = h("tr", { "data-run": run.run_id, "data-depth": depth },
        first,
        h("td", {}, run.tenant),
        h("td", {}, stateBadge(run), run.question ? h("div", { class: "small muted" }, "asks: ", run.question) : null),
        h("td", { class: "cmd", title: run.command.join(" ") }, run.command.join(" ")),
        h("td", { class: "num" }, fmtCost(run.usage.cost_usd)),
        h("td", { class: "num" }, fmtInt(run.usage.input_tokens + run.usage.output_tokens)),
        h("td", { class: "num", title: fmtTime(run.created_at) }, fmtAge(run.created_at)));
      tr.addEventListener("click", (e) => { if (e.target.tagName !== "A") location.hash = `#/runs/${run.run_id}`; });
      body.append(tr);
      rows.push(tr);
    }
    select(Math.min(selected, rows.length - 1));
    prev.disabled = state.page === 0;
    next.disabled = !more;
    const from = state.page * PAGE_SIZE;
    pageInfo.textContent = runs.length ? `${from + 1}–${from + runs.length}${more ? "" : " (end)"}` : "";
    if (runs.length && window.keelFirstRowAt === undefined) {
      window.keelFirstRowAt = performance.now();
      document.body.dataset.runsRendered = "1";
    }
  }

  function select(i) {
    rows.forEach((r) => r.classList.remove("selected"));
    if (i < 0 || !rows[i]) return;
    selected = i;
    rows[i].classList.add("selected");
  }

  async function load() {
    if (abort) abort.abort();
    abort = new AbortController();
    error.textContent = "";
    const q = query({
      limit: PAGE_SIZE + 1, offset: state.page * PAGE_SIZE, state: state.state, tenant: state.tenant.trim(),
      q: state.q.trim(), sort: state.sort,
    });
    try {
      const runs = await api("/v1/runs" + q, { signal: abort.signal });
      render(runs.slice(0, PAGE_SIZE), runs.length > PAGE_SIZE);
    } catch (err) {
      if (err.name !== "AbortError") error.textContent = err.message;
    }
  }

  stateSelect.addEventListener("change", () => go({ state: stateSelect.value, page: 0 }));
  sortSelect.addEventListener("change", () => go({ sort: sortSelect.value, page: 0 }));
  tenantInput.addEventListener("input", debounce(() => go({ tenant: tenantInput.value, page: 0 }), 300));
  search.addEventListener("input", debounce(() => go({ q: search.value, page: 0 }), 250));

  const keys = (e) => {
    if (e.target.matches("input, textarea, select")) {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    if (e.key === "/") { e.preventDefault(); search.focus(); }
    else if (e.key === "j") select(Math.min(rows.length - 1, selected + 1));
    else if (e.key === "k") select(Math.max(0, selected - 1));
    else if (e.key === "Enter" && rows[selected]) location.hash = `#/runs/${rows[selected].dataset.run}`;
    else if (e.key === "n" && !next.disabled) next.click();
    else if (e.key === "p" && !prev.disabled) prev.click();
  };
  document.addEventListener("keydown", keys);
  const reload = debounce(load, 300);
  const off = onChanges(() => reload());

  view.append(
    h("div", { class: "row" }, h("h1", {}, "Runs"), h("span", { class: "spacer" }),
      h("span", { class: "muted small" }, h("span", { class: "live-dot" + (document.body.dataset.live === "on" ? " on" : "") }), "live"),
      h("span", { class: "muted small" }, h("kbd", {}, "j"), " ", h("kbd", {}, "k"), " move · ", h("kbd", {}, "Enter"), " open · ", h("kbd", {}, "/"), " search")),
    h("div", { class: "panel" },
      h("div", { class: "row" }, search, stateSelect, tenantInput, sortSelect),
      error,
      table,
      h("div", { class: "pager" }, pageInfo, prev, next)),
  );
  load();
  return { leave: () => { off(); document.removeEventListener("keydown", keys); if (abort) abort.abort(); } };
}

// ---------------------------------------------------------------- one run

function kindOf(method) {
  if (method.startsWith("llm.")) return "llm";
  if (method.startsWith("tool.")) return "tool";
  if (method === "code.exec") return "exec";
  if (method.startsWith("human.") || method === "sys.sleep" || method === "proc.wait" || method === "ipc.recv") return "wait";
  if (method.startsWith("ipc.")) return "ipc";
  if (method.startsWith("mem.")) return "mem";
  if (method.startsWith("proc.")) return "proc";
  return "other";
}
const KINDS = ["llm", "tool", "exec", "wait", "ipc", "mem", "proc", "other"];

function entryLabel(entry) {
  const p = entry.params || {};
  if (entry.method === "tool.call" && p.tool) return `tool.call ${p.tool}`;
  if (entry.method === "llm.chat") {
    const model = (entry.result && entry.result.response && entry.result.response.model) || p.model;
    if (model) return `llm.chat ${model}`;
  }
  return entry.method;
}

/** The journal as a timeline: a row per syscall, a bar from start to finish. */
function timeline(inspect, selectedSeq, onSelect) {
  const entries = inspect.journal;
  if (!entries.length) return h("p", { class: "muted" }, "No syscalls yet.");
  const now = Date.now();
  const start = Math.min(...entries.map((e) => e.started_at));
  const end = Math.max(start + 1, ...entries.map((e) => e.finished_at || (TERMINAL.has(inspect.state) ? e.started_at : now)));
  const W = 980, labelW = 230, rowH = 22, top = 22;
  const plotW = W - labelW - 120;
  const x = (t) => labelW + ((t - start) / (end - start)) * plotW;
  const svg = s("svg", { viewBox: `0 0 ${W} ${top + entries.length * rowH + 6}`, role: "img", "aria-label": "journal timeline", id: "timeline" });
  for (let i = 0; i <= 4; i++) {
    const t = start + ((end - start) * i) / 4;
    svg.append(s("line", { class: "gridline", x1: x(t), x2: x(t), y1: top - 6, y2: top + entries.length * rowH }));
    svg.append(s("text", { class: "axis", x: x(t), y: 12, "text-anchor": "middle" }, "+" + fmtDuration(t - start)));
  }
  entries.forEach((entry, i) => {
    const y = top + i * rowH;
    const kind = kindOf(entry.method);
    const replayed = entry.attempt < inspect.attempt;
    const pending = entry.status === "pending";
    const finish = entry.finished_at || (pending && !TERMINAL.has(inspect.state) ? now : entry.started_at);
    const x0 = x(entry.started_at);
    const width = Math.max(3, x(finish) - x0);
    svg.append(s("text", { class: "lane-label", x: 4, y: y + 15 }, `${entry.seq} ${entryLabel(entry)}`.slice(0, 34)));
    const cls = ["entry", `k-fill-${kind}`, replayed ? "replayed" : "live", pending ? "pending" : "", entry.seq === selectedSeq ? "selected" : ""].join(" ");
    const bar = s("rect", {
      class: cls, x: x0, y: y + 4, width, height: rowH - 8, tabindex: 0, role: "button",
      "data-seq": entry.seq, "data-method": entry.method, "data-kind": kind, "data-replayed": replayed ? "true" : "false",
      "aria-label": `${entry.method} seq ${entry.seq}`,
    });
    const tokens = entry.usage.input_tokens + entry.usage.output_tokens;
    bar.append(s("title", {}, `${entryLabel(entry)} · ${entry.status}${replayed ? " · replayed" : ""} · ${fmtDuration(entry.duration_ms)}${tokens ? ` · ${tokens} tokens` : ""}${entry.usage.cost_usd ? " · " + fmtCost(entry.usage.cost_usd) : ""}`));
    bar.addEventListener("click", () => onSelect(entry));
    bar.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); onSelect(entry); } });
    svg.append(bar);
    const note = [entry.duration_ms !== undefined ? fmtDuration(entry.duration_ms) : entry.status,
      tokens ? `${fmtInt(tokens)} tok` : "", entry.usage.cost_usd ? fmtCost(entry.usage.cost_usd) : "", replayed ? "replayed" : ""]
      .filter(Boolean).join(" · ");
    svg.append(s("text", { class: "axis", x: Math.min(x0 + width + 6, W - 116), y: y + 15 }, note));
  });
  const legend = h("div", { class: "legend" }, KINDS.map((k) => h("span", {}, h("i", { class: `k-fill-${k}` }), k)),
    h("span", {}, "faded: replayed from the journal (an earlier attempt)"), h("span", {}, "dashed: in flight"));
  return h("div", { class: "timeline" }, svg, legend);
}

function entryDetail(entry, attempt) {
  if (!entry) return h("p", { class: "muted small" }, "Click a bar for its params and result.");
  const u = entry.usage;
  return h("div", { id: "entry-detail", "data-seq": entry.seq },
    h("h2", {}, `#${entry.seq} ${entry.method}`),
    h("dl", { class: "kv" },
      h("dt", {}, "status"), h("dd", {}, entry.status),
      h("dt", {}, "attempt"), h("dd", {}, `${entry.attempt}${entry.attempt < attempt ? " (replayed in later attempts)" : ""}`),
      h("dt", {}, "started"), h("dd", {}, fmtTime(entry.started_at)),
      h("dt", {}, "duration"), h("dd", {}, entry.duration_ms !== undefined ? fmtDuration(entry.duration_ms) : "in flight"),
      h("dt", {}, "tokens"), h("dd", {}, `${fmtInt(u.input_tokens)} in · ${fmtInt(u.output_tokens)} out`),
      h("dt", {}, "cost"), h("dd", {}, fmtCost(u.cost_usd))),
    h("h2", {}, "Params"), json(entry.params),
    entry.result !== undefined ? [h("h2", {}, "Result"), json(entry.result)] : null,
    entry.error !== undefined ? [h("h2", {}, "Error"), json(entry.error)] : null);
}

const LIMITS = [["usd", "cost", fmtCost], ["tokens", "tokens", fmtInt], ["llm_calls", "LLM calls", fmtInt], ["tool_calls", "tool calls", fmtInt], ["wall_secs", "wall clock", (v) => fmtDuration(v * 1000)]];

function budgetBars(run) {
  const budget = run.budget;
  if (!budget) return h("p", { class: "muted small" }, "No budget: every limit is open.");
  const rows = LIMITS.filter(([key]) => budget.limits[key] !== undefined && budget.limits[key] !== null).map(([key, label, fmt]) => {
    const limit = budget.limits[key];
    const left = budget.remaining[key] ?? limit;
    const used = Math.max(0, limit - left);
    const ratio = limit > 0 ? Math.min(1, used / limit) : 1;
    const fill = h("span", {});
    fill.style.width = `${(ratio * 100).toFixed(1)}%`;
    return h("div", { class: "budget-row", "data-limit": key },
      h("span", {}, label),
      h("div", { class: "bar" + (ratio >= 1 ? " full" : ratio > 0.8 ? " high" : ""), role: "meter", "aria-valuemin": 0, "aria-valuemax": limit, "aria-valuenow": used, "aria-label": label }, fill),
      h("span", { class: "small" }, `${fmt(used)} of ${fmt(limit)}`));
  });
  return rows.length ? h("div", {}, rows) : h("p", { class: "muted small" }, "No limits set.");
}

/** The inputs to answer a question: a form from its schema, else a text box. */
function answerForm(run, onDone) {
  if (run.question_form) {
    return schemaForm(run.question_form, {
      name: "answer", submitLabel: "Answer",
      onSubmit: async (value) => {
        await api(`/v1/runs/${run.run_id}/answer`, { method: "POST", body: { value } });
        toast("Answer sent.");
        onDone();
      },
    });
  }
  const input = h("textarea", { name: "answer", "aria-label": "answer", rows: 2 });
  const error = h("div", { class: "error", role: "alert" });
  const form = h("form", { "data-form": "answer" }, input, h("div", { class: "row" }, h("button", { type: "submit" }, "Answer")), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    try {
      await api(`/v1/runs/${run.run_id}/answer`, { method: "POST", body: { text: input.value } });
      toast("Answer sent.");
      onDone();
    } catch (err) {
      error.textContent = err.message;
    }
  });
  return form;
}

function approvalControls(runId, approval, onDone) {
  const note = h("input", { type: "text", name: "note", placeholder: "note (kept in the audit log)", size: 30, "aria-label": "note" });
  const error = h("div", { class: "error", role: "alert" });
  const decide = async (decision) => {
    error.textContent = "";
    try {
      const body = { decision };
      if (note.value.trim()) body.note = note.value.trim();
      await api(`/v1/runs/${runId}/approvals/${approval.call}`, { method: "POST", body });
      toast(`Call ${approval.call} ${decision === "approve" ? "approved" : "denied"}.`);
      onDone();
    } catch (err) {
      error.textContent = err.message;
    }
  };
  return h("div", { class: "approval", "data-call": approval.call },
    h("div", {}, h("strong", {}, approval.tool), h("span", { class: "muted small" }, ` call ${approval.call} · ${approval.kind.replace(/_/g, " ")} · ${fmtAge(approval.requested_at)}`)),
    json(approval.args),
    h("div", { class: "row" }, note,
      h("button", { type: "button", "data-action": "approve", onclick: () => decide("approve") }, "Approve"),
      h("button", { type: "button", class: "danger", "data-action": "deny", onclick: () => decide("deny") }, "Deny")),
    error);
}

function topUpForm(runId, onDone, { loop = false } = {}) {
  const usd = h("input", { type: "number", name: "usd", min: 0, step: "any", size: 6, placeholder: "0.50" });
  const tokens = h("input", { type: "number", name: "tokens", min: 0, step: 1, size: 8 });
  const llm = h("input", { type: "number", name: "llm_calls", min: 0, step: 1, size: 5 });
  const tools = h("input", { type: "number", name: "tool_calls", min: 0, step: 1, size: 5 });
  const cont = h("input", { type: "checkbox", name: "continue", checked: loop });
  const error = h("div", { class: "error", role: "alert" });
  const form = h("form", { "data-form": "top-up" },
    h("div", { class: "row" },
      h("label", {}, "+ USD", usd), h("label", {}, "+ tokens", tokens), h("label", {}, "+ LLM calls", llm), h("label", {}, "+ tool calls", tools),
      h("label", { class: "check" }, cont, "let a loop go on"),
      h("button", { type: "submit" }, loop ? "Let it go on" : "Top up")),
    error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    const add = {};
    for (const [key, input, integer] of [["usd", usd, false], ["tokens", tokens, true], ["llm_calls", llm, true], ["tool_calls", tools, true]]) {
      if (input.value === "") continue;
      const n = Number(input.value);
      if (!(n >= 0) || (integer && !Number.isInteger(n))) {
        error.textContent = `${key} must be a ${integer ? "whole " : ""}number, 0 or more`;
        return;
      }
      add[key] = n;
    }
    if (!Object.keys(add).length && !cont.checked) {
      error.textContent = "Add to a limit, or tick “let a loop go on”.";
      return;
    }
    try {
      await api(`/v1/runs/${runId}/budget`, { method: "POST", body: { add, continue: cont.checked } });
      toast("Budget topped up.");
      onDone();
    } catch (err) {
      error.textContent = err.message;
    }
  });
  return form;
}

/** What is typed in a run's message box, by run: the run page is drawn again at each of
 *  the run's changes, and a draft must outlive that. */
const messageDrafts = new Map();

function messageForm(runId) {
  const text = h("textarea", { name: "message", rows: 2, placeholder: '{"hello": "agent"}  (JSON; plain text is sent as a string)', "aria-label": "message" });
  text.value = messageDrafts.get(runId) || "";
  text.addEventListener("input", () => messageDrafts.set(runId, text.value));
  const error = h("div", { class: "error", role: "alert" });
  const form = h("form", { "data-form": "message" }, text, h("div", { class: "row" }, h("button", { type: "submit" }, "Send message")), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    if (!text.value.trim()) {
      error.textContent = "Write the message first: JSON, or plain text.";
      return;
    }
    let message;
    try {
      message = JSON.parse(text.value);
    } catch (_) {
      message = text.value;
    }
    try {
      const sent = await api(`/v1/runs/${runId}/messages`, { method: "POST", body: { message } });
      toast(`Message ${sent.seq} sent.`);
      text.value = "";
      messageDrafts.delete(runId);
    } catch (err) {
      error.textContent = err.message;
    }
  });
  return form;
}

/** A `ui` block of an agent, rendered from data only. */
function uiBlock(runId, block) {
  const title = block.title ? h("h2", {}, block.title) : null;
  switch (block.type) {
    case "table":
      return h("div", { class: "block", "data-block": "table" }, title,
        h("table", {}, h("thead", {}, h("tr", {}, (block.columns || []).map((c) => h("th", {}, String(c))))),
          h("tbody", {}, (block.rows || []).map((row) => h("tr", {}, [].concat(row).map((cell) => h("td", {}, cell === null ? "" : String(cell))))))));
    case "chart":
      return h("div", { class: "block", "data-block": "chart" },
        chart({ kind: block.kind === "line" ? "line" : "bar", labels: (block.labels || []).map(String), series: (block.series || []).map((x) => ({ name: String(x.name), values: x.values || [] })), title: block.title }));
    case "markdown":
      return h("div", { class: "block", "data-block": "markdown" }, title, markdown(block.text || ""));
    case "progress": {
      const value = Math.max(0, Math.min(1, Number(block.value) || 0));
      const fill = h("span", {});
      fill.style.width = `${(value * 100).toFixed(1)}%`;
      return h("div", { class: "block", "data-block": "progress" }, title,
        h("div", { class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 1, "aria-valuenow": value }, fill),
        h("div", { class: "progress-label" }, `${block.label ? block.label + " · " : ""}${Math.round(value * 100)}%`));
    }
    case "form":
      return h("div", { class: "block", "data-block": "form" }, title,
        schemaForm(block.schema || {}, {
          name: `ui-${block.id}`, submitLabel: "Send",
          onSubmit: async (value) => {
            await api(`/v1/runs/${runId}/messages`, { method: "POST", body: { message: { ui_form: block.id, value } } });
            toast("Form sent to the agent.");
          },
        }));
    default:
      return h("div", { class: "block muted small" }, `(a block of type ${JSON.stringify(block.type)} this console does not know)`);
  }
}

function runPage(id) {
  const abort = new AbortController();
  let inspect = null;
  let selected = null;
  const keys = {};
  const head = h("div", {});
  const actions = h("div", { class: "panel", id: "actions" });
  const questionBox = h("div", { id: "question" });
  const approvalsBox = h("div", { id: "approvals" });
  const budgetBox = h("div", { id: "budget" });
  const timelineBox = h("div", {});
  const detailBox = h("div", { class: "panel", id: "detail" });
  const blocksBox = h("div", { id: "blocks" });
  const logs = h("div", { class: "logs", id: "logs", tabindex: 0, "aria-label": "logs" });
  const outputBox = h("div", { id: "output" });
  const auditBox = h("div", { id: "audit" });
  const error = h("div", { class: "error", "data-role": "error" });
  const blocks = new Map();

  view.append(
    h("p", { class: "small" }, h("a", { href: "#/runs" }, "← Runs")),
    error, head,
    h("div", { class: "grid" },
      h("div", { class: "panel" }, h("h2", {}, "Budget"), budgetBox),
      actions),
    questionBox, approvalsBox,
    h("div", { class: "panel" }, h("h2", {}, "Timeline"), timelineBox),
    detailBox,
    h("div", { class: "panel", id: "ui-panel" }, h("h2", {}, "Agent UI"), blocksBox),
    h("div", { class: "grid" },
      h("div", { class: "panel" }, h("h2", {}, "Logs"), logs),
      h("div", { class: "panel" }, h("h2", {}, "Output"), outputBox)),
    h("div", { class: "panel" }, h("h2", {}, "Audit"), auditBox),
  );

  const act = async (what, body) => {
    try {
      await api(`/v1/runs/${id}/${what}`, { method: "POST", body });
      toast(`${what[0].toUpperCase() + what.slice(1)} sent.`);
      refresh();
    } catch (err) {
      toast(err.message, true);
    }
  };

  /** Re-renders a section only when what it shows changed (keeps what a user types). */
  function section(name, key, box, build) {
    if (keys[name] === key) return;
    keys[name] = key;
    fill(box, build());
  }

  function render() {
    const run = inspect;
    fill(head, h("div", { class: "panel" },
      h("div", { class: "row" }, h("h1", { class: "mono" }, run.run_id), stateBadge(run), h("span", { class: "spacer" }),
        h("span", { class: "muted" }, `attempt ${run.attempt}`), h("strong", { id: "run-cost" }, fmtCost(run.usage.cost_usd))),
      h("dl", { class: "kv" },
        h("dt", {}, "command"), h("dd", { class: "mono" }, run.command.join(" ")),
        h("dt", {}, "tenant"), h("dd", {}, run.tenant),
        h("dt", {}, "created"), h("dd", {}, `${fmtTime(run.created_at)} (${fmtAge(run.created_at)})`),
        run.ended_at ? [h("dt", {}, "ended"), h("dd", {}, `${fmtTime(run.ended_at)} · took ${fmtDuration(run.ended_at - run.created_at)}`)] : null,
        run.parent ? [h("dt", {}, "parent"), h("dd", {}, h("a", { href: `#/runs/${run.parent}` }, run.parent))] : null,
        h("dt", {}, "usage"), h("dd", {}, `${fmtInt(run.usage.input_tokens)} in · ${fmtInt(run.usage.output_tokens)} out tokens · ${run.usage.llm_calls} LLM calls (${run.provider_calls} served) · ${run.usage.tool_calls} tool calls`),
        run.reason ? [h("dt", {}, "why"), h("dd", {}, run.reason)] : null,
        run.error ? [h("dt", {}, "error"), h("dd", { class: "error" }, run.error)] : null)));
    const ended = TERMINAL.has(run.state);
    section("actions", `${run.state}`, actions, () => [
      h("h2", {}, "Act"),
      h("div", { class: "row" },
        h("button", { type: "button", class: "ghost", "data-action": "pause", disabled: ended || run.state === "paused", onclick: () => act("pause") }, "Pause"),
        h("button", { type: "button", class: "ghost", "data-action": "resume", disabled: run.state !== "paused", onclick: () => act("resume") }, "Resume"),
        h("button", { type: "button", class: "danger", "data-action": "stop", disabled: ended, onclick: () => { if (confirm(`Stop ${run.run_id}?`)) act("stop"); } }, "Stop")),
      ended ? null : [h("h2", {}, "Top up"), topUpForm(run.run_id, refresh, { loop: (run.reason || "").startsWith("loop detected") }), h("h2", {}, "Message"), messageForm(run.run_id)],
    ]);
    section("question", run.question ? `${run.question}|${JSON.stringify(run.question_form || null)}` : "", questionBox, () =>
      run.question ? h("div", { class: "panel item" }, h("h2", {}, "Question"), h("p", { "data-role": "question" }, run.question), answerForm(run, refresh)) : []);
    section("approvals", JSON.stringify(run.approvals.map((a) => a.call)), approvalsBox, () =>
      run.approvals.length ? h("div", { class: "panel item" }, h("h2", {}, "Waiting for approval"), run.approvals.map((a) => approvalControls(run.run_id, a, refresh))) : []);
    fill(budgetBox, budgetBars(run));
    const pick = (entry) => { selected = entry.seq; fill(detailBox, entryDetail(entry, run.attempt)); renderTimeline(); };
    const renderTimeline = () => fill(timelineBox, timeline(run, selected, pick));
    renderTimeline();
    const current = run.journal.find((e) => e.seq === selected);
    fill(detailBox, entryDetail(current, run.attempt));
    section("output", JSON.stringify(run.output ?? null), outputBox, () =>
      run.output !== undefined ? json(run.output) : h("p", { class: "muted small" }, ended ? "No output." : "Not yet."));
  }

  function renderBlocks() {
    clear(blocksBox);
    if (!blocks.size) {
      blocksBox.append(h("p", { class: "muted small" }, "Nothing shown by the agent (", h("code", {}, "ui.show"), ")."));
      return;
    }
    [...blocks.keys()].sort((a, b) => a - b).forEach((seq) => blocksBox.append(uiBlock(id, blocks.get(seq))));
  }

  async function refresh() {
    try {
      inspect = await api(`/v1/runs/${id}`, { signal: abort.signal });
      error.textContent = "";
      render();
      const audit = await api(`/v1/audit` + query({ run: id }), { signal: abort.signal });
      fill(auditBox, audit.length
        ? h("table", {}, h("thead", {}, h("tr", {}, ["when", "actor", "action", "subject", "outcome"].map((c) => h("th", {}, c)))),
          h("tbody", {}, audit.map((a) => h("tr", {}, h("td", {}, fmtTime(a.at)), h("td", {}, a.actor), h("td", {}, a.action), h("td", {}, a.subject), h("td", {}, a.outcome)))))
        : h("p", { class: "muted small" }, "No audit entries."));
    } catch (err) {
      if (err.name !== "AbortError") error.textContent = err.message;
    }
  }
  const soon = debounce(refresh, 250);

  function log(kind, text) {
    const atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
    logs.append(h("div", { class: kind }, text));
    if (atBottom) logs.scrollTop = logs.scrollHeight;
  }

  async function followEvents() {
    let after = 0;
    while (!abort.signal.aborted) {
      try {
        await follow(`/v1/runs/${id}/events` + query({ follow: true, after }), {
          signal: abort.signal,
          onEvent: ({ data }) => {
            if (!data || typeof data !== "object") return;
            after = Math.max(after, data.seq || 0);
            const d = data.data || {};
            if (data.kind === "stdout") log("stdout", d.line);
            else if (data.kind === "stderr") log("stderr", d.line);
            else if (data.kind === "ui" && d.block) {
              blocks.set(d.seq ?? data.seq, d.block);
              renderBlocks();
            } else {
              if (data.kind === "state") log("meta", `— ${d.state}${d.wait_reason ? ` (${d.wait_reason})` : ""}${d.error ? ": " + d.error : ""}`);
              if (data.kind === "syscall" || data.kind === "state" || data.kind === "question" || data.kind === "approval"
                || data.kind === "decision" || data.kind === "budget" || data.kind === "answer" || data.kind === "launch") soon();
            }
          },
        });
        // The stream ends after the run's final state.
        if (inspect && TERMINAL.has(inspect.state)) return;
        await refresh();
        if (inspect && TERMINAL.has(inspect.state)) return;
      } catch (err) {
        if (abort.signal.aborted) return;
        if (err instanceof ApiError && err.status === 404) return;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  }

  renderBlocks();
  refresh().then(followEvents);
  return { leave: () => abort.abort() };
}

// ---------------------------------------------------------------- inbox

function inboxPage() {
  const abort = new AbortController();
  const list = h("div", { id: "inbox" });
  const error = h("div", { class: "error", "data-role": "error" });
  let shown = "";
  view.append(h("div", { class: "row" }, h("h1", {}, "Inbox"), h("span", { class: "spacer" }),
    h("span", { class: "muted small" }, "Everything waiting for a person, oldest first.")), error, list);

  function item(it) {
    const run = it.run;
    let act;
    if (it.kind === "question") act = answerForm(run, load);
    else if (it.kind === "approval") act = it.approvals.map((a) => approvalControls(run.run_id, a, load));
    else act = topUpForm(run.run_id, load, { loop: it.kind === "loop" });
    return h("div", { class: "panel item", "data-run": run.run_id, "data-kind": it.kind },
      h("div", { class: "row" }, h("span", { class: `badge k-${it.kind}` }, it.kind),
        h("a", { href: `#/runs/${run.run_id}`, class: "mono" }, run.run_id),
        h("span", { class: "muted small" }, `${run.tenant} · ${run.command.join(" ")}`),
        h("span", { class: "spacer" }), h("span", { class: "muted small", title: fmtTime(it.since) }, `waiting ${fmtAge(it.since).replace(" ago", "")}`)),
      h("p", { "data-role": "summary" }, it.summary),
      act);
  }

  async function load() {
    try {
      const inbox = await api("/v1/inbox", { signal: abort.signal });
      error.textContent = "";
      const key = JSON.stringify(inbox.items.map((i) => [i.run.run_id, i.kind, i.summary, i.approvals.map((a) => a.call)]));
      const badge = document.getElementById("inbox-count");
      badge.textContent = String(inbox.items.length);
      badge.hidden = inbox.items.length === 0;
      if (key === shown) return; // Keep what is being typed.
      shown = key;
      fill(list, inbox.items.length ? inbox.items.map(item) : h("div", { class: "panel muted" }, "Nothing is waiting for you."));
    } catch (err) {
      if (err.name !== "AbortError") error.textContent = err.message;
    }
  }
  const off = onChanges(debounce(load, 300));
  load();
  return { leave: () => { off(); abort.abort(); } };
}

// ---------------------------------------------------------------- costs

function costsPage(params) {
  const abort = new AbortController();
  const ranges = { "24h": [24 * 3600e3, "1h"], "7d": [7 * 24 * 3600e3, "1d"], "30d": [30 * 24 * 3600e3, "1d"] };
  const range = h("select", { id: "cost-range", "aria-label": "range" }, Object.keys(ranges).map((k) => h("option", { value: k }, `last ${k}`)));
  range.value = params.get("range") || "24h";
  const tenant = h("input", { id: "cost-tenant", placeholder: "tenant (all)", size: 12, value: params.get("tenant") || "", "aria-label": "tenant" });
  const body = h("div", {});
  const error = h("div", { class: "error", "data-role": "error" });
  view.append(h("div", { class: "row" }, h("h1", {}, "Cost"), h("span", { class: "spacer" }), range, tenant), error, body);

  async function load() {
    const [span, bucket] = ranges[range.value];
    const bucketMs = bucket === "1h" ? 3600e3 : 24 * 3600e3;
    const since = Math.floor((Date.now() - span) / bucketMs) * bucketMs;
    try {
      const costs = await api("/v1/costs" + query({ since, bucket, tenant: tenant.value.trim() }), { signal: abort.signal });
      error.textContent = "";
      const starts = [];
      for (let t = since; t <= Date.now(); t += bucketMs) starts.push(t);
      const label = (t) => {
        const d = new Date(t);
        return bucket === "1h" ? `${String(d.getHours()).padStart(2, "0")}:00` : `${d.getMonth() + 1}/${d.getDate()}`;
      };
      const by = (key) => {
        const names = [...new Set(costs.buckets.map((b) => b[key]))].sort();
        return names.map((name) => ({
          name,
          values: starts.map((t) => costs.buckets.filter((b) => b[key] === name && b.bucket_start === t).reduce((sum, b) => sum + b.cost_usd, 0)),
        }));
      };
      const totals = new Map();
      for (const b of costs.buckets) {
        const key = `${b.tenant}\u0000${b.model}`;
        const t = totals.get(key) || { tenant: b.tenant, model: b.model, calls: 0, tokens: 0, cost: 0 };
        t.calls += b.calls; t.tokens += b.input_tokens + b.output_tokens; t.cost += b.cost_usd;
        totals.set(key, t);
      }
      const money = (v) => fmtCost(v);
      fill(body, 
        h("div", { class: "grid" },
          h("div", { class: "panel", id: "chart-tenant" }, chart({ kind: "bar", stacked: true, labels: starts.map(label), series: by("tenant"), format: money, title: "By tenant" })),
          h("div", { class: "panel", id: "chart-model" }, chart({ kind: "bar", stacked: true, labels: starts.map(label), series: by("model"), format: money, title: "By model" }))),
        h("div", { class: "grid" },
          h("div", { class: "panel" }, h("h2", {}, "Totals"),
            totals.size
              ? h("table", { id: "cost-totals" }, h("thead", {}, h("tr", {}, h("th", {}, "Tenant"), h("th", {}, "Model"), h("th", { class: "num" }, "Calls"), h("th", { class: "num" }, "Tokens"), h("th", { class: "num" }, "Cost"))),
                h("tbody", {}, [...totals.values()].sort((a, b) => b.cost - a.cost).map((t) =>
                  h("tr", {}, h("td", {}, t.tenant), h("td", { class: "mono" }, t.model), h("td", { class: "num" }, fmtInt(t.calls)), h("td", { class: "num" }, fmtInt(t.tokens)), h("td", { class: "num" }, fmtCost(t.cost))))))
              : h("p", { class: "muted" }, "No LLM calls in this range.")),
          h("div", { class: "panel" }, h("h2", {}, "Most expensive runs"),
            costs.top_runs.length
              ? h("table", { id: "top-runs" }, h("tbody", {}, costs.top_runs.map((r) =>
                h("tr", {}, h("td", {}, h("a", { href: `#/runs/${r.run_id}`, class: "mono" }, r.run_id)), h("td", {}, r.tenant), h("td", {}, stateBadge(r)), h("td", { class: "num" }, fmtCost(r.usage.cost_usd))))))
              : h("p", { class: "muted" }, "No run has cost anything yet."))),
      );
    } catch (err) {
      if (err.name !== "AbortError") error.textContent = err.message;
    }
  }
  range.addEventListener("change", load);
  tenant.addEventListener("input", debounce(load, 300));
  load();
  return { leave: () => abort.abort() };
}

// ---------------------------------------------------------------- health

function healthPage() {
  const abort = new AbortController();
  const body = h("div", {});
  const error = h("div", { class: "error", "data-role": "error" });
  view.append(h("h1", {}, "Health"), error, body);
  const table = (columns, rows) => h("table", {}, h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));

  async function load() {
    try {
      let status = null;
      try {
        status = await api("/v1/status", { signal: abort.signal });
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) throw err;
      }
      const health = await api("/v1/health", { signal: abort.signal });
      let nodes = status ? status.nodes : [];
      if (!status) {
        try {
          nodes = await api("/v1/nodes", { signal: abort.signal });
        } catch (_) {
          nodes = [];
        }
      }
      error.textContent = "";
      const parts = [
        h("div", { class: "panel", id: "health-kernel" }, h("h2", {}, "Kernel"), h("dl", { class: "kv" },
          h("dt", {}, "status"), h("dd", {}, health.status),
          h("dt", {}, "version"), h("dd", {}, health.version),
          h("dt", {}, "store"), h("dd", { class: health.store === "ok" || !health.store ? "" : "error" }, status ? `${status.store.backend}: ${status.store.ok ? "ok" : "unreachable"}` : health.store || "ok"),
          h("dt", {}, "providers"), h("dd", {}, health.llm_providers.join(", ") || "none (scripted runs only)"),
          status ? [h("dt", {}, "live"), h("dd", {}, `${status.live} of ${status.max_live ?? "∞"} slots · ${status.queued} queued · ${status.swapped} swapped`),
            h("dt", {}, "waiting"), h("dd", {}, Object.entries(status.waiting).map(([k, v]) => `${k} ${v}`).join(" · "))] : null)),
      ];
      if (status) {
        parts.push(h("div", { class: "panel", id: "health-providers" }, h("h2", {}, "Providers"),
          status.providers.length
            ? table(["provider", "model", "waiting", "in flight", "rate limit", "resets in"], status.providers.map((p) =>
              [p.provider, p.model, String(p.waiting), String(p.in_flight), p.limited ? h("span", { class: "badge s-waiting" }, p.reason || "limited") : "ok", p.reset_in_ms ? fmtDuration(p.reset_in_ms) : ""]))
            : h("p", { class: "muted" }, "No provider queue yet.")));
        if (status.pool) parts.push(h("div", { class: "panel", id: "health-pool" }, h("h2", {}, "Sandbox pool"),
          h("p", {}, `${status.pool.tier}: ${status.pool.warm} warm of ${status.pool.target}`)));
      } else {
        parts.push(h("div", { class: "panel muted small" }, "This kernel has no /v1/status: provider queues and the sandbox pool are not shown."));
      }
      parts.push(h("div", { class: "panel", id: "health-nodes" }, h("h2", {}, "Nodes"),
        nodes.length
          ? table(["node", "address", "state", "runs", "heartbeat", "version"], nodes.map((n) =>
            [n.id, n.addr, n.draining ? "draining" : n.live ? "live" : "dead", String(n.runs), fmtAge(n.heartbeat_at_ms), n.version]))
          : h("p", { class: "muted" }, "One node (not clustered).")));
      fill(body, h("div", { class: "grid" }, parts));
    } catch (err) {
      if (err.name !== "AbortError") error.textContent = err.message;
    }
  }
  load();
  const timer = setInterval(load, 5000);
  return { leave: () => { clearInterval(timer); abort.abort(); } };
}

// ---------------------------------------------------------------- start

document.getElementById("logout").addEventListener("click", logout);
window.addEventListener("hashchange", route);
route();
